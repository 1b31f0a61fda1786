"""Writer subprocess for tests/test_nvme_crash.py (not a test module).

Usage: python nvme_crash_writer.py DIR ITERATION SEED

Opens an NvmeBackend on DIR, prints ``READY``, then runs 5 concurrent workers,
each owning 8 keys, doing evict / write operations forever: four with single
calls, the fifth with ``evict_many`` / ``allocate_many`` + ``write_many`` batches of
whole 64 KiB slots from page-aligned buffers (the coalesced run path). Before an operation
it prints ``S <op> <key> <seq>``; after the backend acknowledged it (the call
returned), ``A <op> <key> <seq>``; every line is flushed. Block content is
``payload(key, seq)`` and the tag is ``b"seq=<seq>"``, so a verifier can tell a
torn, stale or foreign block from the right one. It is killed with SIGKILL.
"""

from __future__ import annotations

import hashlib
import mmap
import random
import sys

import anyio

from tierkv_backends.nvme import NvmeBackend

OPTIONS = {"capacity": "24MiB", "slot_bytes": ["64KiB", "512KiB"], "queue_depth": 4}
KEYS = [f"key{w}-{i}" for w in range(5) for i in range(8)]
BATCH_WORKER = 4


def payload(key: str, seq: int) -> bytes:
    n = int.from_bytes(hashlib.sha256(f"{key}/{seq}/n".encode()).digest()[:4], "little") % (300 * 1024)
    if key.startswith(f"key{BATCH_WORKER}-"):
        n = 64 * 1024  # whole slots of the 64 KiB class
    elif seq % 3 == 0:
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


async def batch_worker(b: NvmeBackend, keys: list[str], present: set[str], base: int, rng: random.Random) -> None:
    counter = 0
    while True:
        batch = rng.sample(keys, rng.randint(2, 6))
        gone = [k for k in batch if k in present]
        if gone:
            for k in gone:
                emit(f"S E {k} 0")
            await b.evict_many(gone)
            for k in gone:
                present.discard(k)
                emit(f"A E {k} 0")
        if rng.random() < 0.2:
            continue
        seqs = []
        bufs = []
        for k in batch:
            counter += 1
            seqs.append(base + counter)
            buf = mmap.mmap(-1, 64 * 1024)
            buf[:] = payload(k, base + counter)
            bufs.append(buf)
        for k, seq in zip(batch, seqs, strict=True):
            emit(f"S W {k} {seq}")
        allocs = await b.allocate_many(
            [(k, 64 * 1024, f"seq={seq}".encode()) for k, seq in zip(batch, seqs, strict=True)]
        )
        await b.write_many(allocs, bufs)
        for k, seq in zip(batch, seqs, strict=True):
            present.add(k)
            emit(f"A W {k} {seq}")


async def main(path: str, iteration: int, seed: int) -> None:
    b = await NvmeBackend.open({"path": path, **OPTIONS})
    present = {i.key for i in await b.scan()}
    emit("READY")
    async with anyio.create_task_group() as tg:
        for w in range(5):
            ks = [k for k in KEYS if k.startswith(f"key{w}-")]
            fn = batch_worker if w == BATCH_WORKER else worker
            tg.start_soon(fn, b, ks, present, iteration * 1_000_000 + w * 100_000, random.Random(seed * 10 + w))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
