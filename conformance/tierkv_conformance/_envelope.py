"""Performance envelope: the backend's throughput next to a raw reference measured in the same run.

Rows are ``{block_bytes, op, gbps, p50_us, p99_us, raw_gbps, ratio, ratio_lo, ratio_hi, raw_method,
count, concurrency}``.
Throughput is measured through the batch twins (``allocate_many`` +
``write_many``, ``read_many`` into caller buffers; batches of up to
:data:`BATCH_BYTES`), as an engine moves a request's blocks; ``p50_us`` and
``p99_us`` are single-operation latencies. Throughput (``gbps``, ``raw_gbps``) is
the median over repetitions; latencies are pooled over all of them. Each
repetition measures the backend and its raw reference back to back (which goes
first alternates), and ``ratio`` is the median over repetitions of the ratio
within each such pair, ``ratio_lo``/``ratio_hi`` the lowest and highest of them:
a medium whose speed drifts over seconds (a cloud VM's virtual disk moves by 2x
within one row) then slows or speeds both sides of a pair alike, where a ratio
of two medians would compare repetitions taken at different moments. Every block written
has bytes of its own (random, stamped per write with a counter), so that a deduplicating
backend is measured storing new content, not linking equal content. The raw reference moves
the same number of blocks of the same size:

* memory tiers (dram, cxl, hbm without its own reference): single-stream
  ``memcpy`` (numpy ``copyto``) between buffers spread over the same footprint
  as the backend's (``count`` distinct blocks, and one batch of destination
  buffers for reads), against the backend driven by one task (one stream on
  each side), raw and backend interleaved in every repetition;
* storage tiers (nvme, pfs): ``O_DIRECT`` ``pwritev``/``preadv`` of aligned
  buffers on a file in the backend's directory, laid out (written and synced)
  before timing, at the backend's concurrency
  (buffered, and labelled so, where the filesystem refuses ``O_DIRECT``); for
  a persistent backend the writes are made durable too (``fdatasync`` once per
  batch of the same size), since its ``write`` returns only once durable; both
  sides move the same page-aligned buffers (:class:`IoMemory`, allocated once per
  row: one source block, one ring of a batch's worth of buffers per task or thread,
  the sources of writes and destinations of reads), since on a virtual disk the speed
  of O_DIRECT depends on where the guest placed a buffer's pages; and a backend may give its own
  configuration per block size (``certification.options_for_block(options, block_bytes)``,
  e.g. slots of that size; the row's ``note`` says so);
* anything else: the backend's own :class:`SupportsRawReference`, else none
  (then the row has no ratio and the backend cannot be CERTIFIED).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import itertools
import mmap
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from tierkv.backend import (
    CERTIFY_BATCH_BYTES,
    Backend,
    CertificationProfile,
    RawMeasurement,
    SupportsRawReference,
    TierKind,
    certify_batch,
)

from ._suite import block_key

__all__ = [
    "BLOCK_SIZES",
    "STORAGE_TARGET_BYTES",
    "TARGET_BYTES",
    "EnvelopeRow",
    "IoMemory",
    "measure_envelope",
    "paired_ratio",
    "raw_memcpy",
    "raw_odirect",
]

KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024
BLOCK_SIZES = (16 * KiB, 256 * KiB, 2 * MiB)
#: Block sizes measured in addition for some tier kinds (rdma: its acceptance figure is at 1 and 4 MiB).
_EXTRA_SIZES: dict[TierKind, tuple[int, ...]] = {TierKind.RDMA: (1 * MiB, 4 * MiB)}
#: A network tier (rdma, remote) on a loopback shares the CPUs and the memory bandwidth with
#: its own raw reference (and a server's memory warms up on first use), so its rows get an
#: untimed warm-up pair and more repetitions (medians of both, as for every row); eight even
#: with ``quick``: on a loaded 2-core machine one pair's ratio ranges over 0.75-1.25, and the
#: median of four such pairs still moved by 0.1 from run to run.
#: An even count: each side goes first equally often, so the side that follows the other's
#: clean-up (a server freeing what it held) is not favoured in the median.
_NETWORK_REPS = 10
_NETWORK_QUICK_REPS = 8
_NETWORK = {TierKind.RDMA, TierKind.REMOTE, TierKind.OTHER}
#: Storage media (and the virtual disks of cloud machines above all) vary from one second to
#: the next: storage rows get more repetitions than memory rows. For every tier the backend
#: and raw sides alternate which goes first in each repetition, so that neither always runs
#: on a medium still busy with the other's writes.
_STORAGE_REPS = 11
#: Bytes moved per side and measurement (at most 2048 blocks, at least 32). Storage rows move
#: more: a virtual disk absorbs short bursts in its host's cache, so 128 MiB at 3-5 GB/s
#: (25-40 ms) measured the cache's mood more than the medium.
TARGET_BYTES = 128 * MiB
STORAGE_TARGET_BYTES = 512 * MiB
_MEMORY = {TierKind.DRAM, TierKind.CXL, TierKind.HBM}
_STORAGE = {TierKind.NVME, TierKind.PFS}


@dataclass(frozen=True, slots=True)
class EnvelopeRow:
    block_bytes: int
    op: str
    gbps: float
    p50_us: float
    p99_us: float
    raw_gbps: float | None
    ratio: float | None
    raw_method: str
    count: int
    concurrency: int
    note: str = ""  # e.g. the backend's own configuration for this block size (options_for_block)
    ratio_lo: float | None = None  # lowest per-repetition paired ratio
    ratio_hi: float | None = None  # highest per-repetition paired ratio


def paired_ratio(backend: list[float], raw: list[float]) -> tuple[float | None, float | None, float | None]:
    """(median, lowest, highest) of ``backend[i] / raw[i]`` over the repetitions
    whose raw figure is positive; all None when there is none. A pure function."""
    if len(backend) != len(raw):
        raise ValueError(f"paired_ratio: {len(backend)} backend figures but {len(raw)} raw ones")
    pairs = [g / r for g, r in zip(backend, raw, strict=True) if r > 0]
    if not pairs:
        return None, None, None
    return statistics.median(pairs), min(pairs), max(pairs)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


# ----------------------------------------------------------------------------- raw references
def raw_memcpy(op: str, block_bytes: int, count: int, batch: int = 0) -> RawMeasurement:
    """Single-stream memcpy of ``count`` blocks laid out as the backend side moves them:
    write copies one source block into ``count`` distinct destination blocks (the
    tier's footprint); read copies ``count`` distinct source blocks into a ring of
    ``batch`` destination buffers (the caller's ``into`` buffers; default: the
    blocks of one :data:`BATCH_BYTES` batch). Neither side is favoured by a
    footprint that fits in the CPU caches."""
    batch = batch or batch_blocks(block_bytes, count)
    pool = [np.empty(block_bytes, dtype=np.uint8) for _ in range(max(1, count))]
    one = np.random.default_rng(0).integers(0, 256, block_bytes, dtype=np.uint8)
    for p in pool:
        p[:] = one
    ring = [np.empty(block_bytes, dtype=np.uint8) for _ in range(max(1, batch))] if op != "write" else []
    for r in ring:
        r.fill(1)
    t0 = time.perf_counter()
    if op == "write":
        for i in range(count):
            np.copyto(pool[i], one)
    else:
        nr = len(ring)
        for i in range(count):
            np.copyto(ring[i % nr], pool[i])
    dt = time.perf_counter() - t0
    return RawMeasurement(block_bytes * count, dt, "memcpy (numpy.copyto, 1 stream, same footprint as the tier)")


def raw_odirect(
    directory: Path,
    op: str,
    block_bytes: int,
    count: int,
    concurrency: int,
    sync_every: int = 0,
    *,
    keep: Path | None = None,
    memory: IoMemory | None = None,
) -> RawMeasurement:
    """``count`` pwritev/preadv of ``block_bytes`` on one file in ``directory`` with
    ``concurrency`` threads; O_DIRECT unless the filesystem refuses it (then
    buffered + fdatasync, labelled). With ``sync_every`` > 0 it is the
    reference for a persistent backend, whose writes are durable on return: the
    blocks go in batches of ``sync_every`` (spread over the threads), each batch
    followed by one ``fdatasync``, as the backend's ``write_many`` of the same batch.
    With ``keep`` the file is that path, laid out only the first time and left in
    place for the next repetition (the caller removes it): deleting and re-creating
    it between repetitions would load the filesystem while the backend's side runs.
    With ``memory`` the I/O goes from and into those buffers (the ones the backend side
    of the same row uses: thread ``w`` writes from and reads into the ring
    ``memory.rings[w]`` in turn); else from and into one fresh buffer per thread."""
    directory.mkdir(parents=True, exist_ok=True)
    path = keep or directory / f".tierkv-raw-{os.getpid()}-{threading.get_ident()}"
    # one slot per block moved (up to 1 GiB), as the backend side writes every block of a
    # measurement to a slot of its own: rewriting a smaller file would let a virtual disk's
    # host cache absorb the second pass
    slots = max(1, min(count, GiB // max(1, block_bytes)))
    flags = os.O_RDWR | os.O_CREAT
    method = "O_DIRECT pwritev/preadv"
    try:
        fd = os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o600)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        fd = os.open(path, flags, 0o600)
        method = "buffered pwritev/preadv + fdatasync (O_DIRECT refused by the filesystem)"
    try:
        own = [mmap.mmap(-1, block_bytes) for _ in range(concurrency)] if memory is None else []
        for b in own:
            b.write(os.urandom(min(block_bytes, 4096)) * (block_bytes // min(block_bytes, 4096)))
        if memory is not None:
            memory.check(block_bytes, concurrency, "raw_odirect")
        src: list[Any] = [memory.src] * concurrency if memory is not None else own
        rings: list[list[Any]] = memory.rings[:concurrency] if memory is not None else [[b] for b in own]
        try:
            os.pwritev(fd, [src[0]], 0)
        except OSError as exc:
            if exc.errno != errno.EINVAL or "O_DIRECT" not in method:
                raise
            os.close(fd)
            fd = os.open(path, flags, 0o600)
            method = "buffered pwritev/preadv + fdatasync (O_DIRECT refused by the filesystem)"
        # lay the file out first (for writes too: a storage tier preallocates its files, so
        # the reference must not pay for extent allocation either)
        if os.fstat(fd).st_size < slots * block_bytes:
            for s in range(slots):
                os.pwritev(fd, [src[0]], s * block_bytes)
            os.fsync(fd)
        errors: list[BaseException] = []
        # writes of a persistent tier go in batches of ``sync_every`` blocks, each made durable
        # (one fdatasync) before the next starts: what the tier does for a write_many
        step = sync_every if op == "write" and sync_every else count
        barrier_sync = op == "write" and bool(sync_every)

        def run(lo: int, hi: int) -> None:
            next_i = iter(range(lo, hi))
            lock = threading.Lock()

            def worker(w: int) -> None:
                out, ring = src[w], rings[w]
                c = 0
                while True:
                    with lock:
                        i = next(next_i, None)
                    if i is None:
                        return
                    try:
                        off = (i % slots) * block_bytes
                        if op == "write" and memory is not None:
                            os.pwritev(fd, [ring[c % len(ring)]], off)  # the backend side's sources
                            c += 1
                        elif op == "write":
                            os.pwritev(fd, [out], off)
                        else:
                            os.preadv(fd, [ring[c % len(ring)]], off)
                            c += 1
                    except BaseException as exc:
                        errors.append(exc)
                        return

            futs = [pool.submit(worker, w) for w in range(min(concurrency, hi - lo))]
            for f in futs:
                f.result()

        with ThreadPoolExecutor(concurrency) as pool:  # threads reused across batches
            for f in [pool.submit(time.sleep, 0) for _ in range(concurrency)]:
                f.result()
            t0 = time.perf_counter()
            for lo in range(0, count, step):
                run(lo, min(count, lo + step))
                if barrier_sync:
                    os.fdatasync(fd)
            if op == "write" and "buffered" in method and not barrier_sync:
                os.fdatasync(fd)
            dt = time.perf_counter() - t0
        if errors:
            raise errors[0]
        for b in own:
            b.close()
    finally:
        os.close(fd)
        if keep is None:
            path.unlink(missing_ok=True)
    sync = f", one fdatasync per batch of {sync_every} blocks" if op == "write" and sync_every else ""
    return RawMeasurement(block_bytes * count, dt, f"{method}{sync}, {concurrency} threads")


# ----------------------------------------------------------------------------- backend side
#: Bytes per batch call when measuring throughput (an engine moves a request's
#: blocks in one batch call); :data:`tierkv.backend.CERTIFY_BATCH_BYTES`.
BATCH_BYTES = CERTIFY_BATCH_BYTES
#: Single-operation samples per (size, op, repetition) for the latency columns.
LATENCY_SAMPLES = 16


#: blocks per batch call (:func:`tierkv.backend.certify_batch`)
batch_blocks = certify_batch


def _page_aligned(nbytes: int) -> memoryview:
    """A page-aligned, touched buffer (anonymous mmap), as the raw O_DIRECT side uses."""
    mv = memoryview(mmap.mmap(-1, max(1, nbytes)))[:nbytes]
    mv[::4096] = b"\x01" * len(mv[::4096])
    return mv


@dataclass(frozen=True, slots=True)
class IoMemory:
    """The buffers of one storage row, shared by the backend side and the raw O_DIRECT
    side: ``src`` (the block every write sends) and one ring of ``per`` destination
    buffers per task/thread (``rings``), all page-aligned and touched. Allocated once
    per row, so that neither side gets better-placed memory: on a virtual disk the
    speed of O_DIRECT into freshly mapped buffers varies by up to 1.6x with where the
    guest happened to place their pages."""

    src: memoryview
    rings: list[list[memoryview]]

    @classmethod
    def allocate(cls, block_bytes: int, concurrency: int, per: int) -> IoMemory:
        return cls(
            _page_aligned(block_bytes), [[_page_aligned(block_bytes) for _ in range(per)] for _ in range(concurrency)]
        )

    def check(self, block_bytes: int, concurrency: int, what: str) -> None:
        """ValueError unless these buffers hold blocks of ``block_bytes`` for ``concurrency`` tasks."""
        if len(self.src) != block_bytes or len(self.rings) < concurrency or not all(self.rings[:concurrency]):
            raise ValueError(f"{what}: memory does not match block_bytes and concurrency")


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Collect garbage now and keep the cyclic collector out of the timed region (as
    ``timeit`` does), so that no earlier repetition's buffers are freed inside it."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


async def _measure_backend(
    b: Backend,
    op: str,
    block_bytes: int,
    count: int,
    concurrency: int,
    rep: int,
    *,
    aligned: bool = False,
    memory: IoMemory | None = None,
) -> tuple[float, list[float]]:
    """Throughput of ``count`` blocks moved with the batch twins by ``concurrency``
    tasks, plus single-operation latencies (allocate+write, or read into a buffer).
    With ``aligned`` (storage tiers) the source and destination buffers are
    page-aligned like the raw O_DIRECT side's; with ``memory`` they are the very
    buffers the raw side of the same row uses."""
    data: bytes | memoryview = np.random.default_rng(rep).integers(0, 256, block_bytes, dtype=np.uint8).tobytes()
    if memory is not None:
        memory.check(block_bytes, concurrency, "_measure_backend")
        memory.src[:] = data
        data = memory.src
    elif aligned:
        src = _page_aligned(block_bytes)
        src[:] = data
        data = src
    keys = [block_key("envelope", block_bytes, rep, i) for i in range(count)]
    per = batch_blocks(block_bytes, count)
    batches = iter([keys[i : i + per] for i in range(0, count, per)])

    if op == "read":
        for i in range(0, count, per):
            part = keys[i : i + per]
            allocs = await b.allocate_many([(k, block_bytes, b"") for k in part])
            await b.write_many(allocs, [data] * len(part))

    # caller buffers exist (and are touched) before timing, as the raw side's memory is
    pools: list[list[bytearray | memoryview]] = (
        [list(r[:per]) for r in memory.rings[:concurrency]]
        if memory is not None
        else [
            [_page_aligned(block_bytes) if aligned else bytearray(block_bytes) for _ in range(per)]
            for _ in range(concurrency)
        ]
    )
    for w, pool in enumerate(pools):
        for j, buf in enumerate(pool):
            if op == "write":
                # every written block gets bytes of its own (a random pool, stamped per write
                # below), so that a deduplicating backend is measured storing, not linking
                buf[:] = np.random.default_rng([rep, w, j]).integers(0, 256, block_bytes, dtype=np.uint8).data
            else:
                buf[::4096] = b"\x01" * len(buf[::4096])
    stamp = itertools.count()

    async def worker(w: int) -> None:
        # index, do not pop: a popped pool would be unmapped when its worker ends, while
        # the others still run (munmap and TLB shootdowns inside the timed region)
        intos = pools[w]
        for part in batches:
            if op == "write":
                srcs = intos[: len(part)]
                for buf in srcs:
                    buf[:8] = next(stamp).to_bytes(8, "little")
                allocs = await b.allocate_many([(k, block_bytes, b"") for k in part])
                await b.write_many(allocs, srcs)
            else:
                await b.read_many(part, into=intos[: len(part)])

    with _no_gc():
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for w in range(concurrency):
                tg.start_soon(worker, w)
        dt = time.perf_counter() - t0
    lat: list[float] = []
    into = _page_aligned(block_bytes) if aligned else bytearray(block_bytes)
    samples = keys[: min(LATENCY_SAMPLES, count)]
    if op == "write":
        await b.evict_many(samples)
    for k in samples:
        t = time.perf_counter()
        if op == "write":
            a = await b.allocate(k, block_bytes)
            await b.write(a, data)
        else:
            await b.read(k, into=into)
        lat.append(time.perf_counter() - t)
    await b.evict_many(keys)
    return block_bytes * count / dt / 1e9, lat


def storage_dir(options: dict[str, Any], fallback: Path) -> Path:
    """The directory a storage backend writes to, from its options (path/root/dir/directory)."""
    for k in ("path", "root", "dir", "directory", "file"):
        v = options.get(k)
        if isinstance(v, str) and v:
            p = Path(v)
            return p.parent if p.suffix or (p.exists() and p.is_file()) else p
    return fallback


async def _raw_side(
    b: Backend,
    op: str,
    size: int,
    count: int,
    concurrency: int,
    options: dict[str, Any],
    workdir: Path,
    memory: IoMemory | None = None,
) -> RawMeasurement | None:
    """One measurement of the raw reference for a row: the backend's own
    (:class:`SupportsRawReference`), memcpy for memory tiers, O_DIRECT on a laid-out
    file in the backend's directory for storage tiers (synced per batch when the tier
    is persistent), else None."""
    caps = b.capabilities
    if isinstance(b, SupportsRawReference):
        return await b.raw_reference(op, size, count, concurrency)
    if caps.tier_kind in _MEMORY:
        return await anyio.to_thread.run_sync(raw_memcpy, op, size, count)
    if caps.tier_kind in _STORAGE:
        d = storage_dir(options, workdir)
        sync_every = batch_blocks(size, count) if caps.persistent else 0
        raw_file = d / f".tierkv-raw-{os.getpid()}-{size}"
        return await anyio.to_thread.run_sync(
            functools.partial(raw_odirect, d, op, size, count, concurrency, sync_every, keep=raw_file, memory=memory)
        )
    return None


async def measure_envelope(
    b: Backend,
    *,
    options: dict[str, Any],
    workdir: Path,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[EnvelopeRow]:
    caps = b.capabilities
    # memory tiers: one stream on each side (the raw memcpy is one stream);
    # storage and network tiers: the backend's concurrency on both sides
    concurrency = 1 if caps.tier_kind in _MEMORY else max(1, min(caps.max_concurrency, 32))
    network = caps.tier_kind in _NETWORK and isinstance(b, SupportsRawReference)
    if network:
        reps = _NETWORK_QUICK_REPS if quick else _NETWORK_REPS
    else:
        reps = 1 if quick else _STORAGE_REPS if caps.tier_kind in _STORAGE else 5
    target = 16 * MiB if quick else STORAGE_TARGET_BYTES if caps.tier_kind in _STORAGE else TARGET_BYTES
    rows: list[EnvelopeRow] = []
    for size in sorted({*BLOCK_SIZES, *_EXTRA_SIZES.get(caps.tier_kind, ())}):
        cur, cur_options, note = b, options, ""
        profile = getattr(type(b), "certification", None)
        tune = profile.options_for_block if isinstance(profile, CertificationProfile) else None
        sized_options = tune(options, size) if tune is not None and size <= caps.max_block_bytes else None
        if sized_options is not None:  # the backend's own configuration for blocks of this size
            cur = await type(b).open(sized_options)
            cur_options = sized_options
            note = "own instance: " + ", ".join(f"{k}={v}" for k, v in sorted(sized_options.items()) if k != "path")
            if progress:
                progress(f"envelope {size // 1024:>5} KiB: {note}")
        try:
            if size > caps.max_block_bytes:
                continue
            s = cur.stats()
            free = max(0, s.capacity_bytes - s.used_bytes)
            granule = s.details.get("granule", 1)
            granule = granule if isinstance(granule, int) and granule > 0 else 1
            footprint = -(-size // granule) * granule
            count = max(32, min(2048, target // size))
            count = min(count, int(free * 0.8) // footprint)
            if count < 4:
                if progress:
                    progress(f"envelope {size} B: skipped, capacity too small")
                continue
            for op in ("write", "read"):
                if caps.tier_kind in _STORAGE:  # nothing left to write back from earlier rows
                    await anyio.to_thread.run_sync(os.sync)
                gb: list[float] = []
                lat: list[float] = []
                raw: list[float] = []
                method = ""
                ref = cur if network and isinstance(cur, SupportsRawReference) else None
                # storage rows against the O_DIRECT reference: both sides use the same buffers
                memory = (
                    IoMemory.allocate(size, concurrency, batch_blocks(size, count))
                    if caps.tier_kind in _STORAGE and not isinstance(cur, SupportsRawReference)
                    else None
                )
                if ref is not None:  # untimed warm-up pair (connections, caches, a server's memory, raw threads)
                    await _measure_backend(cur, op, size, count, concurrency, reps)
                    await ref.raw_reference(op, size, count, concurrency)
                for rep in range(reps):
                    # the raw side goes first on odd repetitions, second on even ones
                    first = (
                        await _raw_side(cur, op, size, count, concurrency, cur_options, workdir, memory)
                        if rep % 2
                        else None
                    )
                    g, l_ = await _measure_backend(
                        cur, op, size, count, concurrency, rep, aligned=caps.tier_kind in _STORAGE, memory=memory
                    )
                    gb.append(g)
                    lat += l_
                    gc.collect()
                    m = (
                        first
                        if rep % 2
                        else await _raw_side(cur, op, size, count, concurrency, cur_options, workdir, memory)
                    )
                    if m is not None:
                        raw.append(m.gbps)
                        method = m.method
                g_med = statistics.median(gb)
                raw_med = statistics.median(raw) if raw else None
                ratio, lo, hi = paired_ratio(gb, raw) if raw else (None, None, None)
                row = EnvelopeRow(
                    block_bytes=size,
                    op=op,
                    gbps=round(g_med, 4),
                    p50_us=round(_pct(lat, 0.5) * 1e6, 1),
                    p99_us=round(_pct(lat, 0.99) * 1e6, 1),
                    raw_gbps=round(raw_med, 4) if raw_med is not None else None,
                    ratio=round(ratio, 3) if ratio is not None else None,
                    ratio_lo=round(lo, 3) if lo is not None else None,
                    ratio_hi=round(hi, 3) if hi is not None else None,
                    raw_method=method or "none (network tier without SupportsRawReference)",
                    count=count,
                    concurrency=concurrency,
                    note=note,
                )
                rows.append(row)
                if progress:
                    progress(
                        f"envelope {size // 1024:>5} KiB {op:<5} {row.gbps:8.3f} GB/s  raw {row.raw_gbps} GB/s  "
                        f"ratio {row.ratio} ({row.ratio_lo}-{row.ratio_hi})  p50 {row.p50_us} us  p99 {row.p99_us} us"
                    )
        finally:
            if caps.tier_kind in _STORAGE:
                (storage_dir(cur_options, workdir) / f".tierkv-raw-{os.getpid()}-{size}").unlink(missing_ok=True)
            if cur is not b:
                await cur.aclose()
                d = storage_dir(cur_options, workdir)
                if d != storage_dir(options, workdir) and storage_dir(options, workdir) in d.parents:
                    await anyio.to_thread.run_sync(shutil.rmtree, d, True)
    return rows
