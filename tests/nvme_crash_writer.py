"""Writer subprocess for tests/test_nvme_crash.py (not a test module).

Usage: python nvme_crash_writer.py DIR ITERATION SEED

Opens an NvmeBackend on DIR, prints ``READY``, then runs 4 concurrent workers,
each owning 8 keys, doing evict / write operations forever. Before an operation
it prints ``S <op> <key> <seq>``; after the backend acknowledged it (the call
returned), ``A <op> <key> <seq>``; every line is flushed. Block content is
``payload(key, seq)`` and the tag is ``b"seq=<seq>"``, so a verifier can tell a
torn, stale or foreign block from the right one. It is killed with SIGKILL.
"""

from __future__ import annotations

import hashlib
import random
import sys

import anyio

from tierkv_backends.nvme import NvmeBackend

OPTIONS = {"capacity": "24MiB", "slot_bytes": ["64KiB", "512KiB"], "queue_depth": 4}
KEYS = [f"key{w}-{i}" for w in range(4) for i in range(8)]


def payload(key: str, seq: int) -> bytes:
    n = int.from_bytes(hashlib.sha256(f"{key}/{seq}/n".encode()).digest()[:4], "little") % (300 * 1024)
    if seq % 3 == 0:
        n %= 64 * 1024
    seed = hashlib.sha256(f"{key}/{seq}".encode()).digest()
    return (seed * (n // 32 + 1))[:n]


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def worker(b: NvmeBackend, keys: list[str], present: set[str], base: int, rng: random.Random) -> None:
    counter = 0
    while True:
        key = rng.choice(keys)
        if key in present and rng.random() < 0.5:
            emit(f"S E {key} 0")
            await b.evict(key)
            present.discard(key)
            emit(f"A E {key} 0")
            continue
        if key in present:
            emit(f"S E {key} 0")
            await b.evict(key)
            present.discard(key)
            emit(f"A E {key} 0")
        counter += 1
        seq = base + counter
        data = payload(key, seq)
        emit(f"S W {key} {seq}")
        a = await b.allocate(key, len(data), tag=f"seq={seq}".encode())
        await b.write(a, data)
        present.add(key)
        emit(f"A W {key} {seq}")


async def main(path: str, iteration: int, seed: int) -> None:
    b = await NvmeBackend.open({"path": path, **OPTIONS})
    present = {i.key for i in await b.scan()}
    emit("READY")
    async with anyio.create_task_group() as tg:
        for w in range(4):
            ks = [k for k in KEYS if k.startswith(f"key{w}-")]
            tg.start_soon(worker, b, ks, present, iteration * 1_000_000 + w * 100_000, random.Random(seed * 10 + w))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
