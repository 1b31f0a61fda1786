"""Publish protocols for a content-addressed PFS layout, against a file-per-block raw client.

This is a design measurement, not a benchmark of the shipped ``pfs`` tier (that is
``bench_tiers.py``): it times the bare protocols the issue's content-addressed
layout could use, so that a layout is chosen from figures. Every side stores the
same blocks as new files, 8 threads, one whole batch per figure:

* ``raw``: ``open(O_CREAT)`` + ``pwrite`` + ``fsync`` + ``close`` per block, the better of
  1 and 8 threads (the reference of ``bench_tiers.py``);
* ``rename``: sha256, a named temp file written and fsynced, renamed onto
  ``keys/<key>``, hard-linked as ``objects/<sha256>`` (dedup hits link the existing
  object), one fsync of ``keys/`` and ``objects/`` per batch;
* ``tmpfile``: sha256, an unnamed ``O_TMPFILE`` inode in ``objects/`` written and
  fsynced, published by ``linkat`` as ``objects/<sha256>``, the key record a hard link
  ``keys/<key>`` to it (the link count is the reference count), one fsync of each
  directory per batch;
* ``tmpfile+symlink``: the same, with the key record a symbolic link whose 200-character
  target carries the tag (as the current ``tierkv-rec3`` records do);
* ``tmpfile+O_DIRECT``: ``tmpfile`` with the object written through ``O_DIRECT`` from an
  aligned copy (4 KiB header page, payload padded);
* ``tmpfile-no-sha256``: ``tmpfile`` with the object named by the block's index instead of
  its sha256: what the publish protocol costs without the hash;
* ``floor``: ``raw`` on 8 threads with a sha256 of each block first (the floor of
  ``bench_tiers.py``): what the hash costs without the protocol.

Sides rotate in order every repetition after an ``os.sync()``; the figure is the median
over repetitions of each side's throughput, divided by raw's.

    python benchmarks/pfs_layouts.py [--dir DIR] [--reps 7] [--mib 256]
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import shutil
import statistics
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import xxhash

HDR = struct.Struct("<8sQ16s")
TAG_HEX = "ab" * 100  # a 100-byte tag as hex, the size of tierkv's own block tags
_local = threading.local()


def _aligned(n: int) -> memoryview:
    bufs: dict[int, memoryview] = getattr(_local, "bufs", {})
    _local.bufs = bufs
    if n not in bufs:
        bufs[n] = memoryview(mmap.mmap(-1, n))
    return bufs[n]


def _dsync(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Layouts:
    def __init__(self, root: Path) -> None:
        self.root = root
        for d in ("raw", "keys", "objects", "tmp"):
            (root / d).mkdir(parents=True, exist_ok=True)
        self.dfd = os.open("/", os.O_RDONLY)  # forces linkat(..., AT_SYMLINK_FOLLOW) for /proc/self/fd

    def raw(self, i: int, s: bytes) -> None:
        fd = os.open(self.root / "raw" / str(i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, s, 0)
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, i: int, s: bytes) -> None:
        h = hashlib.sha256(s).hexdigest()
        obj, key = self.root / "objects" / h, self.root / "keys" / f"k{i}"
        try:
            os.link(obj, key)
            return
        except FileNotFoundError:
            pass
        tmp = self.root / "tmp" / f"k{i}.{uuid.uuid4().hex[:8]}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.pwritev(fd, [HDR.pack(b"tierkv4\0", len(s), xxhash.xxh3_128_digest(s)), s], 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, key)
        try:
            os.link(key, obj)
        except FileExistsError:
            pass

    def raw_sha(self, i: int, s: bytes) -> None:
        hashlib.sha256(s).digest()
        self.raw(i, s)

    def tmpfile(self, i: int, s: bytes, *, symlink: bool, direct: bool, sha: bool = True) -> None:
        h = hashlib.sha256(s).hexdigest() if sha else f"{i:064x}"
        obj, key = self.root / "objects" / h, self.root / "keys" / f"k{i}"
        if not symlink:
            try:
                os.link(obj, key)
                return
            except FileNotFoundError:
                pass
        elif obj.exists():
            os.symlink(f"tierkv-rec4/{h}/{len(s)}/{TAG_HEX}", key)
            return
        head = HDR.pack(b"tierkv4\0", len(s), xxhash.xxh3_128_digest(s))
        fd = os.open(self.root / "objects", os.O_TMPFILE | os.O_WRONLY | (os.O_DIRECT if direct else 0), 0o644)
        try:
            if direct:
                n = 4096 + -(-len(s) // 4096) * 4096
                b = _aligned(n)
                b[: HDR.size] = head
                b[4096 : 4096 + len(s)] = s
                os.pwritev(fd, [b[:n]], 0)
            else:
                os.pwritev(fd, [head, s], 0)
            os.fsync(fd)
            try:
                os.link(f"/proc/self/fd/{fd}", obj, src_dir_fd=self.dfd, follow_symlinks=True)
            except FileExistsError:
                pass
        finally:
            os.close(fd)
        if symlink:
            os.symlink(f"tierkv-rec4/{h}/{len(s)}/{TAG_HEX}", key)
        else:
            os.link(obj, key)

    def clear(self) -> None:
        for d in ("raw", "keys", "objects"):
            for p in (self.root / d).iterdir():
                p.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="directory on the filesystem to measure (default: a temp dir in .)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--mib", type=int, default=256, help="MiB per side and figure (at most 1024 blocks)")
    args = ap.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tierkv-pfs-layouts-", dir="."))
    lay = Layouts(base / "store")
    pool = ThreadPoolExecutor(8)
    sides: dict[str, Callable[[int, bytes], None]] = {
        "raw1": lay.raw,
        "raw8": lay.raw,
        "rename": lay.rename,
        "tmpfile": lambda i, s: lay.tmpfile(i, s, symlink=False, direct=False),
        "tmpfile+symlink": lambda i, s: lay.tmpfile(i, s, symlink=True, direct=False),
        "tmpfile+O_DIRECT": lambda i, s: lay.tmpfile(i, s, symlink=False, direct=True),
        "tmpfile-no-sha256": lambda i, s: lay.tmpfile(i, s, symlink=False, direct=False, sha=False),
        "floor": lay.raw_sha,
    }
    try:
        for size in (16 * 1024, 256 * 1024, 2 * 1024 * 1024):
            n = max(4, min(1024, args.mib * 2**20 // size))
            rng = np.random.default_rng(size)
            srcs = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(n)]
            res: dict[str, list[float]] = {k: [] for k in sides}
            names = list(sides)
            for r in range(args.reps):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    os.sync()
                    fn = sides[name]
                    t0 = time.perf_counter()
                    if name == "raw1":
                        for i, s in enumerate(srcs):
                            fn(i, s)
                    else:
                        list(pool.map(fn, range(n), srcs))
                        if name not in ("raw8", "floor"):
                            _dsync(lay.root / "keys")
                            _dsync(lay.root / "objects")
                    res[name].append(n * size / (time.perf_counter() - t0) / 1e9)
                    lay.clear()
            raw = max(statistics.median(res["raw1"]), statistics.median(res["raw8"]))
            cells = "  ".join(
                f"{k} {statistics.median(v) / raw:.2f}" for k, v in res.items() if not k.startswith("raw")
            )
            print(f"{size // 1024:>5} KiB x {n}: raw {raw:.3f} GB/s  {cells}", flush=True)
    finally:
        shutil.rmtree(base / "store", ignore_errors=True)
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
