"""Writer subprocess for tests/test_crash_recovery.py (not a test module), and its shared helpers.

Usage: python crash_workload.py DIR SEED

Opens a TierKV over dram + nvme + pfs under DIR (scheduler service running), prints
``READY``, then runs 4 concurrent client tasks forever, each doing a random mix of
``put(durable=True)``, plain ``put``, ``get`` (checked bit for bit), ``lookup`` and, now and
then, ``checkpoint``. DRAM and NVMe are small, so puts force demotions dram -> nvme -> pfs and
gets of demoted blocks trigger promotions. Two tenants store *different* KV under the
*same* tokens, so a cross-tenant (cross-scope) block would show as wrong bytes.

After ``put(..., durable=True)`` returns it prints ``D <tenant> <seed> <blocks>`` (flushed): that
prefix is *acknowledged as durable*. A wrong ``get`` prints ``BAD ...`` and exits 3. The
process is killed with SIGKILL by the test.

Data is deterministic: sequence ``seed`` belongs to family ``seed % FAMILIES``; its first
``SHARED`` blocks are the family's (shared prefix, same tokens for every member), the rest
its own. The KV of block ``i`` is a function of (tenant, owner, i) only, where the owner is the
family for shared blocks and the seed otherwise, so equal tokens always carry equal KV
within a tenant.
"""

from __future__ import annotations

import functools
import random
import sys
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from kvtest import BLOCK, BT, dram_tier, kv_shape, nvme_tier, pfs_tier, smol_config

BLOCK_SHAPE = kv_shape(BT)
SEEDS = 24
FAMILIES = 4
SHARED = 1
MAX_BLOCKS = 4
TENANTS = ("alice", "bob")


def config(root: Path, *, dram_blocks: int = 6, nvme: str = "8MiB") -> dict[str, Any]:
    tiers = [dram_tier(dram_blocks * BLOCK), nvme_tier(root, nvme, "512KiB"), pfs_tier(root, "2GiB")]
    return smol_config(tiers, revision="crash")


def tokens_of(seed: int, blocks: int) -> list[int]:
    fam = seed % FAMILIES
    out: list[int] = []
    for i in range(blocks):
        base = 1_000_000 + fam * 1000 + i * BT if i < SHARED else 2_000_000 + seed * 1000 + i * BT
        out.extend(range(base, base + BT))
    return out


@functools.lru_cache(maxsize=4096)
def _block(tenant: int, owner: tuple[int, int], i: int) -> np.ndarray:
    rng = np.random.default_rng([tenant, owner[0], owner[1], i])
    # any bit pattern (NaNs included): comparisons are on bytes
    return np.frombuffer(rng.bytes(BLOCK), dtype=np.float16).reshape(BLOCK_SHAPE)


def kv_of(tenant: int, seed: int, blocks: int) -> np.ndarray:
    parts = [_block(tenant, (0, seed % FAMILIES) if i < SHARED else (1, seed), i) for i in range(blocks)]
    return np.ascontiguousarray(np.concatenate(parts, axis=2))


def check_get(tenant: int, seed: int, got_tokens: int, got_kv: Any) -> str:
    """'' if a get result for (tenant, seed) is right, else what is wrong."""
    if got_tokens % BT or got_tokens > MAX_BLOCKS * BT:
        return f"odd prefix length {got_tokens}"
    if got_tokens == 0:
        return "" if got_kv is None else "kv for an empty prefix"
    want = kv_of(tenant, seed, got_tokens // BT)
    if np.asarray(got_kv).tobytes() != want.tobytes():
        return f"wrong bytes for tenant {TENANTS[tenant]} seed {seed} prefix {got_tokens}"
    return ""


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def client(kv: Any, rng: random.Random, worker: int) -> None:
    from tierkv import TierKVError

    n = 0
    while True:
        n += 1
        tenant = rng.randrange(len(TENANTS))
        seed = rng.randrange(SEEDS)
        blocks = rng.randint(1, MAX_BLOCKS)
        toks = tokens_of(seed, blocks)
        r = rng.random()
        if r < 0.35:
            try:
                await kv.put(toks, kv_of(tenant, seed, blocks), tenant=TENANTS[tenant], durable=True)
            except (TierKVError, KeyError) as exc:  # not acknowledged; counted by the test (KeyError: core bug)
                emit(f"PUTERR {type(exc).__name__} {exc}")
                continue
            emit(f"D {tenant} {seed} {blocks}")
        elif r < 0.55:
            try:
                await kv.put(toks, kv_of(tenant, seed, blocks), tenant=TENANTS[tenant])
            except (TierKVError, KeyError) as exc:
                emit(f"PUTERR {type(exc).__name__} {exc}")
        elif r < 0.9:
            g = await kv.get(tokens_of(seed, MAX_BLOCKS), tenant=TENANTS[tenant])
            bad = check_get(tenant, seed, g.tokens, g.kv)
            if bad:
                emit(f"BAD {bad}")
                sys.exit(3)
        elif r < 0.98:
            await kv.lookup(toks, tenant=TENANTS[tenant])
        elif worker == 0:
            await kv.checkpoint(f"ck{n % 2}")
            emit("CKPT")


async def main(root: str, seed: int) -> None:
    from tierkv import TierKV

    async with await TierKV.open(config(Path(root))) as kv:
        emit("READY")
        async with anyio.create_task_group() as tg:
            for w in range(4):
                tg.start_soon(client, kv, random.Random(seed * 10 + w), w)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
