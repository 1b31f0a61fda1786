"""Concurrency and cancellation defects driven through the public API (asyncio and trio).

Each test drives :class:`TierKV` the way a hostile but ordinary user would (many tasks,
cancellation at random points, small capacities, the scheduler service running) and ends
by asserting the invariants: pins all released, each tier's blocks and bytes equal to what
the index places there, every returned byte equal to what was put.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from kvtest import BLOCK, BT, dram_tier, kv_for, nvme_tier, pfs_tier, smol_config

from tierkv import CapacityError, PagedLayout, TierKV, TierKVError

pytestmark = pytest.mark.anyio


@functools.cache
def _family_kv(family: int) -> np.ndarray:
    return kv_for(6 * BT, 1000 + family)


def base_kv(family: int, n: int) -> np.ndarray:
    """The KV of prefix ``n`` of family ``family``'s base prompt (a function of the prefix)."""
    return np.ascontiguousarray(_family_kv(family)[:, :, :n])


def base_tokens(family: int, n: int) -> list[int]:
    return [family * 100_000 + i for i in range(n)]


#: the paged ops' layout: vLLM flash-attention caches, per layer ``[2, num_blocks, BT/2, heads, dim]``
PAGED = PagedLayout.named("vllm-flash", BT // 2)
PAGED_BLOCKS = 6 * BT // PAGED.block_size  # engine blocks per cache: a family's whole prompt


def paged_caches(kv: np.ndarray | None, table: np.ndarray) -> list[np.ndarray]:
    """Per layer a vllm-flash cache of ``PAGED_BLOCKS`` engine blocks; with ``kv`` (canonical,
    ``(layers, 2, tokens, heads, dim)``) engine block ``j`` of it is written at ``table[j]``."""
    layers, _, _, heads, dim = _family_kv(0).shape
    out = [np.full((2, PAGED_BLOCKS, PAGED.block_size, heads, dim), -1.0, np.float16) for _ in range(layers)]
    if kv is not None:
        eb = PAGED.block_size
        for j in range(kv.shape[2] // eb):
            for layer in range(layers):
                out[layer][:, table[j]] = kv[layer, :, j * eb : (j + 1) * eb]
    return out


def assert_sound(kv: TierKV) -> None:
    problems = kv.invariant_violations()
    assert problems == [], problems


@contextlib.asynccontextmanager
async def serving(cfg: dict[str, Any]) -> AsyncIterator[TierKV]:
    """A TierKV with its scheduler service running; on exit the service is stopped, the
    invariants are asserted with nothing in flight (before close frees volatile tiers)."""
    kv = await TierKV.open(cfg)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(kv.run_scheduler)
            yield kv
            tg.cancel_scope.cancel()
        assert_sound(kv)
    finally:
        await kv.aclose()


async def test_cancelled_gets_release_their_pins(tmp_path: Path) -> None:
    """A get cancelled at any point releases its pins (the release never awaits)."""
    cfg = smol_config([pfs_tier(tmp_path, "64MiB")])
    async with await TierKV.open(cfg) as kv:
        toks = base_tokens(1, 4 * BT)
        await kv.put(toks, base_kv(1, 4 * BT))
        rng = random.Random(7)
        cancelled = 0
        for _ in range(300):
            with anyio.move_on_after(rng.uniform(0, 0.003)) as scope:
                await kv.get(toks)
            cancelled += scope.cancelled_caught
        assert cancelled > 0
        assert_sound(kv)
        # nothing is pinned any more, so every block can be invalidated
        assert await kv.invalidate() == 4
        assert (await kv.lookup(toks)).tokens == 0


async def test_concurrent_writers_never_fail_for_each_others_space(tmp_path: Path) -> None:
    """With nothing pinned and an evictable bottom tier, no put fails for lack of room."""
    for writers in (8, 32):
        sub = tmp_path / f"w{writers}"
        cfg = smol_config([dram_tier(6 * BLOCK), pfs_tier(sub, 20 * BLOCK)])
        errors: list[BaseException] = []
        async with serving(cfg) as kv:

            async def writer(w: int, errors: list[BaseException] = errors) -> None:
                for r in range(4):
                    fam = w * 10 + r
                    try:
                        await kv.put(base_tokens(fam, 3 * BT), base_kv(fam, 3 * BT))
                    except CapacityError as exc:
                        errors.append(exc)

            async with anyio.create_task_group() as tg:
                for w in range(writers):
                    tg.start_soon(writer, w)
            assert errors == [], f"{len(errors)} CapacityError with {writers} writers: {errors[0]}"


async def test_service_survives_victims_leaving_the_index(tmp_path: Path) -> None:
    """Victims chosen for shedding may be invalidated, evicted or moved before their turn:
    no untyped error reaches a caller and the service task group never dies."""
    cfg = smol_config([dram_tier(4 * BLOCK), pfs_tier(tmp_path, 10 * BLOCK)])
    untyped: list[BaseException] = []
    async with serving(cfg) as kv:

        async def worker(w: int) -> None:
            rng = random.Random(w)
            for _ in range(25):
                fam = rng.randrange(12)
                n = rng.randrange(1, 4) * BT
                op = rng.random()
                try:
                    if op < 0.45:
                        await kv.put(base_tokens(fam, n), base_kv(fam, n))
                    elif op < 0.85:
                        g = await kv.get(base_tokens(fam, n))
                        if g.tokens:
                            assert g.kv.tobytes() == base_kv(fam, g.tokens).tobytes()
                    elif op < 0.95:
                        await kv.lookup(base_tokens(fam, n))
                    else:
                        await kv.invalidate()
                except TierKVError:
                    pass
                except Exception as exc:
                    untyped.append(exc)

        async with anyio.create_task_group() as tg:
            for w in range(48):
                tg.start_soon(worker, w)
        assert untyped == []
        assert kv.failed_jobs == 0


async def run_random_workload(
    tmp_path: Path,
    *,
    tasks: int,
    seconds: float,
    seed: int,
    policy: str = "lru",
    partial: bool = False,
    force: str | None = None,
    one_tier: bool = False,
) -> dict[str, int]:
    """The randomized concurrency run of the acceptance list: dram + nvme + pfs at small
    capacities, the service running, put (whole, or a chunk from a strided view)/get/lookup/
    invalidate, paged put/get (vLLM flash caches through a shuffled block table, ``get_paged`` from
    an engine's own prefix ``start`` too) with tiny deadlines; ``partial``: with
    ``partial_blocks`` (tails stored); ``force`` (adaptive policy, the caller keeps the adapter
    from switching): the cache follows recency with the frequency admission filter on
    (``"admission"``: it must have cut at least one put, ``counts["filtered"]``) or by ARC
    (``"arc"``: ARC must have chosen victims at least once, ``counts["filtered"]``) or by its session
    shadow (``"session"``: the shadow must have cut at least one put); ``one_tier``: a
    single DRAM tier, the fastest tier is the bottom one, so a full tier makes room for a put's
    batch at once (``Mover.allocate_many_with_room``: it must have shed for a batch at least once,
    ``counts["batch_sheds"]``; no durable puts)."""
    tiers = [dram_tier(6 * BLOCK), nvme_tier(tmp_path, 8 * 512 * 1024, "512KiB"), pfs_tier(tmp_path, 16 * BLOCK)]
    if one_tier:
        tiers = [dram_tier(12 * BLOCK)]
    cfg = smol_config(tiers, scheduler={"policy": policy}, partial_blocks=partial)
    counts = {
        "ops": 0,
        "cancelled": 0,
        "typed_errors": 0,
        "hits": 0,
        "tail_hits": 0,
        "paged_hits": 0,
        "filtered": 0,
        "tails_refused": 0,
    }
    counts["batch_sheds"] = counts["protected"] = 0
    wrong: list[str] = []
    untyped: list[BaseException] = []
    async with serving(cfg) as kv:
        if force in ("admission", "segmented", "fresh"):
            ad = kv._sched.tau_adapter
            assert ad is not None and kv._sched.sketch is not None and kv._sched.arc_target is not None
            ad.recency_mode = kv._sched.recency = True
            ad._set_recency({"admission": 1, "segmented": 2, "fresh": 5}[force])
            assert kv._sched.admit and kv._sched.slru == (force != "admission") and not kv._sched.arc
            fresh = kv._sched.fresh_sketch
            assert (kv._sched.admission_sketch is fresh) == (force == "fresh")
            writer = kv._s.writer
            admitted = writer._admitted

            def counting(*args: Any) -> tuple[list[int], bool]:
                kept, tail_ok = out = admitted(*args)
                # a put cut (a whole block, or the new tail it offered, refused)
                counts["filtered"] += len(kept) < len(args[1]) or (
                    len(args) > 5 and args[5] is not None and not tail_ok
                )
                counts["tails_refused"] += len(args) > 5 and args[5] is not None and not tail_ok
                counts["protected"] = max(counts["protected"], *(t.arc[1].n for t in kv._s.tiers))
                return out

            writer._admitted = counting  # type: ignore[method-assign]
        elif force == "session":
            ad = kv._sched.tau_adapter
            assert ad is not None and kv._sched.session is not None
            ad.session_mode = ad.recency_mode = kv._sched.recency = True
            assert kv._sched.session_mode and not (kv._sched.admit or kv._sched.arc)
            ses_writer = kv._s.writer
            followed = ses_writer._followed

            def session_counting(
                keys: Any, todo: list[int], missed: list[bool], tail: bytes | None = None
            ) -> tuple[list[int], list[bool], bool]:
                out = followed(keys, todo, missed, tail)
                # a put cut where the shadow declined (a whole block, or the new tail)
                counts["filtered"] += len(out[0]) < len(todo) or (tail is not None and not out[2])
                counts["tails_refused"] += tail is not None and not out[2]
                return out

            ses_writer._followed = session_counting  # type: ignore[method-assign]
        elif force == "arc":
            ad = kv._sched.tau_adapter
            assert ad is not None and kv._sched.arc_target is not None
            ad.arc_mode = ad.recency_mode = kv._sched.recency = True
            assert kv._sched.arc
            mover = kv._s.mover
            arc_lists = mover._arc_lists

            def arc_counting(ti: int) -> Any:
                counts["filtered"] += 1
                return arc_lists(ti)

            mover._arc_lists = arc_counting  # type: ignore[method-assign]
        if one_tier:
            shed = kv._s.mover.shed

            async def shed_counting(ti: int, need: int, **kw: Any) -> int:
                counts["batch_sheds"] += kw.get("victims") is not None
                return await shed(ti, need, **kw)

            kv._s.mover.shed = shed_counting  # type: ignore[method-assign]
        deadline = anyio.current_time() + seconds
        # on a slow machine the run goes on past ``seconds`` (to at most 4x) until each kind of
        # operation the assertions below count has happened at least once
        hard_deadline = anyio.current_time() + 4 * seconds

        def running() -> bool:
            now = anyio.current_time()
            covered = (
                all(counts[c] > 0 for c in ("cancelled", "hits", "paged_hits"))
                and (counts["tail_hits"] > 0 or not partial)
                and (counts["filtered"] > 0 or force is None)
                and (counts["batch_sheds"] > 0 or not one_tier)
            )
            return now < deadline or (not covered and now < hard_deadline)

        async def paged_op(kv: TierKV, rng: random.Random, fam: int, n: int) -> None:
            eb = PAGED.block_size
            fam, n = fam % 4, max(BT, n // eb * eb)  # a few families: their paged blocks get hit
            table = np.array(rng.sample(range(PAGED_BLOCKS), PAGED_BLOCKS), np.int64)
            if rng.random() < 0.5:
                await kv.put_paged(base_tokens(fam, n), paged_caches(base_kv(fam, n), table), table, layout=PAGED)
                return
            start = rng.choice([0, 0, rng.randrange(n // BT + 1) * BT])
            dst = paged_caches(None, table)
            g = await kv.get_paged(base_tokens(fam, n), dst, table, layout=PAGED, start=start)
            if g.tokens > start:
                counts["paged_hits"] += 1
                want = paged_caches(base_kv(fam, g.tokens), table)
                for j in range(start // eb, g.tokens // eb):
                    for layer in range(len(dst)):
                        if dst[layer][:, table[j]].tobytes() != want[layer][:, table[j]].tobytes():
                            wrong.append(f"paged family {fam}, engine block {j}, layer {layer}")
                for j in range(start // eb):  # the engine's own prefix is never written
                    if (dst[0][:, table[j]] != -1.0).any():
                        wrong.append(f"paged family {fam}: engine block {j} below start={start} written")

        async def worker(w: int) -> None:
            rng = random.Random(seed * 1000 + w)
            while running():
                fam = rng.randrange(24)
                n = rng.randrange(1, 5) * BT + rng.randrange(BT)
                op = rng.random()
                budget = rng.choice([None, None, rng.uniform(0, 0.004)])
                counts["ops"] += 1
                try:
                    with anyio.move_on_after(budget if budget is not None else 30) as scope:
                        if op < 0.3:
                            durable = rng.random() < 0.2 and not one_tier
                            await kv.put(base_tokens(fam, n), base_kv(fam, n), durable=durable)
                        elif op < 0.4:  # only the newest blocks (a chunk put of a strided view)
                            start = rng.randrange(n // BT + 1) * BT
                            await kv.put(base_tokens(fam, n), _family_kv(fam)[:, :, start:n], start=start)
                        elif op < 0.8:
                            out = np.zeros((30, 2, n, 3, 64), np.float16) if rng.random() < 0.5 else None
                            g = await kv.get(base_tokens(fam, n), out=out)
                            if g.tokens:
                                counts["hits"] += 1
                                counts["tail_hits"] += bool(g.tokens % BT)
                                got = np.asarray(g.kv)[:, :, : g.tokens]
                                if got.tobytes() != base_kv(fam, g.tokens).tobytes():
                                    wrong.append(f"family {fam}, {g.tokens} tokens")
                        elif op < 0.88:
                            await kv.lookup(base_tokens(fam, n))
                        elif op < 0.9:
                            await kv.invalidate()
                        else:  # paged: the family's whole engine blocks, then a get_paged into fresh caches
                            await paged_op(kv, rng, fam, n)
                    counts["cancelled"] += scope.cancelled_caught
                except TierKVError:
                    counts["typed_errors"] += 1
                except Exception as exc:
                    untyped.append(exc)

        async with anyio.create_task_group() as tg:
            for w in range(tasks):
                tg.start_soon(worker, w)
        assert untyped == [], untyped[:3]
        assert wrong == [], wrong[:3]
        assert kv.failed_jobs == 0
    assert counts["cancelled"] > 0 and counts["hits"] > 0 and counts["paged_hits"] > 0
    assert counts["filtered"] > 0 or force is None
    assert counts["batch_sheds"] > 0 or not one_tier
    return counts


@pytest.mark.parametrize(
    ("policy", "partial"),
    [
        ("lru", False),
        ("predictive", False),
        ("lru", True),
        ("predictive", True),
        ("adaptive", False),
        ("adaptive", True),
    ],
)
async def test_random_concurrency_invariants(tmp_path: Path, policy: str, partial: bool) -> None:
    """With ``partial`` the store keeps tails too (``partial_blocks``): prompts of any length
    store and hit their trailing partial block, and the same invariants hold."""
    counts = await run_random_workload(tmp_path, tasks=64, seconds=6.0, seed=1, policy=policy, partial=partial)
    assert (counts["tail_hits"] > 0) == partial


@pytest.mark.parametrize("policy", ["lru", "predictive"])
async def test_random_concurrency_invariants_one_tier_batched_sheds(tmp_path: Path, policy: str) -> None:
    """One DRAM tier (the bottom one), the service running: a full tier sheds once for a put's
    batch while puts are cancelled at random points; every invariant and every byte holds."""
    await run_random_workload(tmp_path, tasks=64, seconds=4.0, seed=3, policy=policy, one_tier=True)


@pytest.mark.parametrize(
    ("force", "partial"),
    [
        ("admission", False),
        ("segmented", False),
        ("fresh", False),
        ("arc", False),
        ("session", False),
        ("admission", True),
        ("session", True),
    ],
)
async def test_random_concurrency_invariants_with_admission_or_arc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, force: str, partial: bool
) -> None:
    """The adaptive policy held on recency with its frequency admission filter on (in front of an LRU or
    of the segmented LRU, by slow or by fresh counts), on ARC, or on its session shadow (three tiers, default watermarks, the
    service running): puts the filter or the session shadow cuts, or ARC's or the segments' victims,
    under cancels at random points, keep every invariant (ARC's lists, the segments, included) and
    every byte. ``partial``: tails stored too, which the filter and the session shadow decide as well."""
    from tierkv.scheduler import TauAdapter

    monkeypatch.setattr(TauAdapter, "_choose_mode", lambda self, now, cur: None)
    monkeypatch.setattr(TauAdapter, "_choose_recency", lambda self: None)
    counts = await run_random_workload(
        tmp_path, tasks=64, seconds=4.0, seed=5, policy="adaptive", force=force, partial=partial
    )
    assert counts["filtered"] > 0
    assert (counts["tail_hits"] > 0) == partial
    assert (counts["tails_refused"] > 0) == partial  # new tails were offered to the filter, and some refused
    assert counts["protected"] > 0 or force not in ("segmented", "fresh")  # the protected segment was used


@pytest.mark.slow
async def test_random_concurrency_invariants_long(tmp_path: Path) -> None:
    seconds = float(os.environ.get("TIERKV_SOAK_S", "80"))  # 2 runs x 2 event loops: >= 5 min in all
    for seed, policy in ((2, "lru"), (3, "predictive")):
        await run_random_workload(tmp_path / str(seed), tasks=64, seconds=seconds, seed=seed, policy=policy)


async def test_parents_never_rank_below_their_descendants(tmp_path: Path) -> None:
    """Predictive ranking: within a request a parent's eviction key is at least its child's
    (a child is useless without its parent), whatever the predictor thinks of each cell."""
    cfg = smol_config([dram_tier(64 * BLOCK)], scheduler={"policy": "predictive"})
    kv = await TierKV.open(cfg)
    try:
        for fam in range(6):
            await kv.put(base_tokens(fam, 5 * BT), base_kv(fam, 5 * BT))
            for _ in range(fam % 3):
                await kv.get(base_tokens(fam, (2 + fam % 3) * BT))
        for fam in range(6):
            _, keys, _ = kv._s.keys(base_tokens(fam, 5 * BT), None)
            ranks = [kv._index[k.hex()].rank for k in keys]
            assert ranks == sorted(ranks, reverse=True), (fam, ranks)
    finally:
        await kv.aclose()


async def test_invalidate_while_a_durable_copy_moves_down_leaves_no_orphan(tmp_path: Path) -> None:
    """A block served from dram whose durable copy is being moved from nvme down to pfs is
    invalidated while the pfs write is in flight: the new copy is freed, not left behind as a
    durable copy of a block the index no longer has."""
    cfg = smol_config(
        [dram_tier(8 * BLOCK), nvme_tier(tmp_path, 4 * 512 * 1024, "512KiB"), pfs_tier(tmp_path, 16 * BLOCK)]
    )
    kv = await TierKV.open(cfg)
    try:
        toks = base_tokens(1, 2 * BT)
        await kv.put(toks, base_kv(1, 2 * BT), durable=True)
        s = kv._s
        assert [s.index.entries[k.hex()].backing for k in s.keys(toks, None)[1]] == [1, 1]
        pfs = s.tiers[2].backend
        real_write = pfs.write
        entered, release = anyio.Event(), anyio.Event()

        async def gated_write(alloc: Any, data: Any) -> None:
            entered.set()
            await release.wait()
            await real_write(alloc, data)

        pfs.write = gated_write  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.mover.shed, 1, BLOCK)  # one victim: the first block's durable copy
            await entered.wait()
            moving = [e for e in s.index.entries.values() if e.pins]
            assert len(moving) == 1
            # a block pinned by the relocation is in use: invalidate skips it ...
            assert await kv.invalidate() == 1
            # ... but an invalidate that chose it before the pin drops it all the same
            await s.mover.drop(moving[0])
            release.set()
        pfs.write = real_write  # type: ignore[method-assign]
        assert_sound(kv)
        assert (await kv.lookup(toks)).tokens == 0
    finally:
        await kv.aclose()
