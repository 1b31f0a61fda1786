"""The NVMe tier: preallocated slab files addressed by slot, O_DIRECT I/O, crash-safe commit.

Layout (see ``docs/tiers.md``)
------------------------------
Each configured directory holds one slab file per slot size class,
``tierkv-nvme-<slot_bytes>.slab``. A slab file is::

    page 0      geometry record (magic, version, slot_bytes, nslots, checksum algorithm, crc)
    page 1      checkpoint record (generation G, crc): every block of generation <= G is complete
    slot i      at 8192 + i * stride, stride = 4096 + round_up(slot_bytes, 4096):
                [4096-byte slot header][payload padded to 4096]

A slot header holds magic, state (committed / free), a generation number
(unique and increasing over the life of the slab set), key, payload length,
tag, the payload checksum (crc32c when the ``crc32c`` package is present,
zlib crc32 otherwise; recorded in the geometry) and a crc32 over the header.

Commit protocol ("acknowledged")
--------------------------------
``write`` puts header and payload in the slot with one O_DIRECT ``pwritev``
and then ``fdatasync``; it returns (the block is *acknowledged*) only after
both. ``write_many`` issues the ``pwritev`` of every block of the batch
(``queue_depth`` in flight), then one ``fdatasync`` per slab file touched, and
only then makes the blocks visible and returns: every block of the batch is
acknowledged at that point, none before. ``evict`` (``evict_many``: every
slot of the batch, then one ``fdatasync`` per slab) writes a *free* header over
the slot and ``fdatasync``\\ s it before returning and before the slot can be
reused. On open every slot header
is read: a block is served only if its header checksum is valid, its state is
committed and, if its generation is above the checkpoint, its payload checksum
matches (a torn or stale payload is caught there). Two committed headers for
one key: the higher generation wins, the other is invalidated. Slots that fail
are durably invalidated before a new checkpoint is written, so that a later
torn write can never resurrect them. ``read`` reads the payload alone and
always verifies it against the checksum the index keeps for the block (taken
from its header at commit or recovery, so a stale or torn slot cannot match);
a mismatch raises IntegrityError and quarantines the block.

Accounting: a block holds a whole slot, so ``used_bytes`` counts the slot size of
every block and reservation (0 for an empty block); ``details["logical_bytes"]``
holds the requested bytes and, with one size class, ``details["granule"]`` is
the slot size (the conformance suite's footprint rule).

Concurrency: single-block calls run in anyio worker threads behind a
CapacityLimiter of ``queue_depth``. Batch calls (``read_many``, ``write_many``,
``evict_many``) take one limiter token and make one thread hop: that thread
submits the batch's I/Os to a ThreadPoolExecutor of ``queue_depth`` workers
owned by the backend (so a batch keeps ``queue_depth`` I/Os in flight) and
waits for all of them. ``aclose`` waits for every limiter token, hence for
every batch, before it shuts the executor down. Cancellation of a write or of
a write batch never abandons an I/O: the worker runs to completion, then every
slot of the cancelled write is durably invalidated (shielded) before its
reservation is released, so nothing of it is visible. A cancelled ``read`` or
``read_many`` without ``into`` returns at once, even while the device stalls:
its thread finishes into the call's own buffers, which are dropped, and keeps
its limiter token until it ends (so ``aclose`` still waits for it). Reads into
a caller's buffers wait for their I/O.

Errors: a full filesystem (``ENOSPC``, ``EDQUOT``; a slab without ``prefill``
is sparse) is :class:`~tierkv.CapacityError`; an open whose new slab files do
not fit their filesystem raises CapacityError before writing them. A failed
open removes the slab files (and directories) it created and gives files it
re-initialised their old size back.
"""

from __future__ import annotations

import ctypes
import errno
import heapq
import mmap
import os
import re
import struct
import threading
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np

from tierkv.backend import (
    MAX_TAG_BYTES,
    Allocation,
    Availability,
    Backend,
    BackendStats,
    BlockInfo,
    Buffer,
    Capabilities,
    CertificationProfile,
    Reservation,
    ReservationLedger,
    TierKind,
    as_byte_view,
    into_view,
    opt_bool,
    opt_choice,
    opt_int,
    opt_size,
    os_error,
    parse_size,
    reject_unknown,
    run_blocking,
    validate_key,
)
from tierkv.errors import (
    BackendIOError,
    BlockNotFoundError,
    CapacityError,
    ConfigError,
    InputError,
    IntegrityError,
    PluginUnavailableError,
    TierKVError,
)

from ._gpu import cuda_usable, kvikio_installed

_T = TypeVar("_T")

__all__ = ["NvmeBackend", "SlotHeader", "pack_slot_header", "unpack_slot_header", "wsum32", "wsum32_torch"]

PAGE = 4096
_DATA_START = 2 * PAGE
_GEOM_MAGIC = b"TKVNVME\x01"
_CKPT_MAGIC = b"TKVCKPT\x01"
_SLOT_MAGIC = b"TKVSLOT\x01"
_VERSION = 1
_GEOM = struct.Struct("<8sIIQQQ")  # magic, version, checksum id, slot_bytes, nslots, stride
_CKPT = struct.Struct("<8sQ")  # magic, generation
_HDR = struct.Struct("<8sB3xQQHHI128s256s")  # magic, state, gen, nbytes, keylen, taglen, payload crc, key, tag
_CRC = struct.Struct("<I")
_STATE_FREE = 0
_STATE_COMMITTED = 1  # payload checksum: the slab's algorithm (crc32c / crc32)
_STATE_COMMITTED_WSUM = 2  # payload checksum: wsum32 (computable on the GPU; blocks written by write_device)
_COMMITTED = (_STATE_COMMITTED, _STATE_COMMITTED_WSUM)
_CHECKSUMS = {1: "crc32", 2: "crc32c"}
_KNOWN = frozenset({"path", "capacity", "slot_bytes", "queue_depth", "io", "checksum", "direct", "prefill"})
_DEFAULT_SLOT_BYTES = 2 << 20
_SLAB_RE = re.compile(r"tierkv-nvme-([0-9]+)\.slab")


def _round_up(n: int, a: int = PAGE) -> int:
    return (n + a - 1) // a * a


def _checksum_fn(name: str) -> Callable[[Any], int]:
    if name == "crc32c":
        import crc32c

        def crc32c_fn(b: Any) -> int:
            return int(crc32c.crc32c(b))

        return crc32c_fn

    def crc32_fn(b: Any) -> int:
        return zlib.crc32(b) & 0xFFFFFFFF

    return crc32_fn


def _crc32c_available() -> bool:
    try:
        import crc32c  # noqa: F401
    except ImportError:
        return False
    return True


_WEIGHTS: dict[int, Any] = {}
_WEIGHTS_LOCK = threading.Lock()


def _weights(nwords: int) -> Any:
    """The odd weights ``2*i + 1`` (uint64) of :func:`wsum32`, cached for the last few sizes."""
    with _WEIGHTS_LOCK:
        w = _WEIGHTS.get(nwords)
        if w is None:
            if len(_WEIGHTS) >= 8:
                _WEIGHTS.pop(next(iter(_WEIGHTS)))
            w = np.arange(nwords, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
            _WEIGHTS[nwords] = w
        return w


def _fold(total: int, nbytes: int) -> int:
    s = (total ^ nbytes) & 0xFFFF_FFFF_FFFF_FFFF
    return (s ^ (s >> 32)) & 0xFFFFFFFF


def wsum32(data: Any) -> int:
    """The device-computable payload checksum of blocks written by ``write_device``.

    The payload, zero-padded to a multiple of 8 bytes, is read as little-endian
    64-bit words ``w[i]``; ``S = sum((2*i + 1) * w[i]) mod 2**64``, then
    ``S ^= nbytes`` and the two halves are xor-folded to 32 bits. Integer sums
    are exact modulo 2**64 in any order, so a GPU reduction
    (:func:`wsum32_torch`) and this numpy one give the same value. Position
    weights make it catch reordered or stale pages, which a plain sum would not.
    """
    b = np.frombuffer(data, dtype=np.uint8)
    n = len(b)
    full = n // 8
    total = 0
    if full:
        words = b[: full * 8].view("<u8")
        total = int(np.dot(words, _weights(full)))  # uint64 dot: wraps modulo 2**64
    if n % 8:
        tail = np.zeros(8, dtype=np.uint8)
        tail[: n % 8] = b[full * 8 :]
        total += int(tail.view("<u8")[0]) * (2 * full + 1)
    return _fold(total, n)


def wsum32_torch(t: Any) -> int:
    """:func:`wsum32` of a contiguous uint8 torch tensor, computed on its device (one reduction)."""
    import torch

    flat = t.reshape(-1)
    n = int(flat.numel())
    pad = (-n) % 8
    if pad or flat.storage_offset() % 8:
        flat = torch.cat([flat, torch.zeros(pad, dtype=torch.uint8, device=flat.device)])
    words = flat.view(torch.int64)
    weights = torch.arange(words.numel(), dtype=torch.int64, device=flat.device) * 2 + 1
    total = int((words * weights).sum().item()) if n else 0  # int64 arithmetic wraps modulo 2**64
    return _fold(total & 0xFFFF_FFFF_FFFF_FFFF, n)


@dataclass(frozen=True, slots=True)
class SlotHeader:
    """A decoded slot header (``state`` 1 = committed, 0 = free)."""

    state: int
    gen: int
    key: str
    nbytes: int
    tag: bytes
    payload_crc: int


def pack_slot_header(h: SlotHeader) -> bytes:
    """Encode a slot header followed by its crc32 (fits in the first 512-byte sector)."""
    kb = h.key.encode("ascii")
    body = _HDR.pack(_SLOT_MAGIC, h.state, h.gen, h.nbytes, len(kb), len(h.tag), h.payload_crc, kb, h.tag)
    return body + _CRC.pack(zlib.crc32(body) & 0xFFFFFFFF)


def unpack_slot_header(raw: bytes | memoryview) -> SlotHeader | None:
    """Decode a slot header; ``None`` if the magic, checksum or fields are invalid."""
    n = _HDR.size
    if len(raw) < n + _CRC.size:
        return None
    body = bytes(raw[:n])
    (crc,) = _CRC.unpack(bytes(raw[n : n + _CRC.size]))
    if zlib.crc32(body) & 0xFFFFFFFF != crc:
        return None
    magic, state, gen, nbytes, klen, tlen, pcrc, kb, tb = _HDR.unpack(body)
    if magic != _SLOT_MAGIC or state not in (_STATE_FREE, *_COMMITTED) or klen > 128 or tlen > MAX_TAG_BYTES:
        return None
    try:
        key = kb[:klen].decode("ascii")
    except UnicodeDecodeError:
        return None
    if state in _COMMITTED:
        try:
            validate_key(key)
        except InputError:
            return None
    return SlotHeader(state, gen, key, nbytes, tb[:tlen], pcrc)


def _sealed(body: bytes) -> bytes:
    return body + _CRC.pack(zlib.crc32(body) & 0xFFFFFFFF)


def _unseal(raw: bytes, st: struct.Struct) -> tuple[Any, ...] | None:
    body, crc = raw[: st.size], raw[st.size : st.size + 4]
    if len(crc) < 4 or _CRC.unpack(crc)[0] != zlib.crc32(body) & 0xFFFFFFFF:
        return None
    return st.unpack(body)


#: most bytes one coalesced pwritev/preadv moves (see :func:`_coalesce`)
_RUN_BYTES = 1 << 20
#: most slots in one coalesced I/O (two iovecs per slot; Linux IOV_MAX is 1024)
_RUN_SLOTS = 512


def _coalesce(slots: Sequence[tuple[int, int] | None], stride: Callable[[int], int], units: int) -> list[list[int]]:
    """Plan the I/Os of a batch (pure): group the indices of ``slots`` whose ``(slab, slot)``
    are adjacent in one slab file into runs moved by one vectored call each.

    ``None`` marks a block that cannot join a run (it is not a whole, page-aligned slot); it
    gets an I/O of its own. A run is cut into pieces of at most ``_RUN_BYTES`` (and
    ``_RUN_SLOTS``), and small enough that the batch still makes at least ``units`` I/Os when
    it can (so ``queue_depth`` of them stay in flight). Each index appears exactly once;
    a group's indices are in slot order.
    """
    alone = [[i] for i, s in enumerate(slots) if s is None]
    order = sorted((s, i) for i, s in enumerate(slots) if s is not None)
    if not order:
        return alone
    per = max(1, -(-len(order) // max(1, units)))
    groups: list[list[int]] = []
    run: list[int] = []
    prev: tuple[int, int] | None = None
    cap = 1
    for (si, slot), i in order:
        if prev is None or si != prev[0] or slot != prev[1] + 1 or len(run) >= cap:
            if run:
                groups.append(run)
            run = []
            cap = max(1, min(per, _RUN_SLOTS, _RUN_BYTES // stride(si)))
        run.append(i)
        prev = (si, slot)
    groups.append(run)
    return groups + alone


def _skip(iovs: list[memoryview], n: int) -> list[memoryview]:
    """The iovecs left after the first ``n`` bytes of ``iovs``."""
    out: list[memoryview] = []
    for v in iovs:
        if n >= len(v):
            n -= len(v)
            continue
        out.append(v[n:] if n else v)
        n = 0
    return out


def _addr(mv: memoryview) -> int:
    """The address of a buffer's first byte (ctypes for writable buffers: several times
    cheaper than a numpy view; numpy for read-only ones)."""
    if not len(mv):
        return 0
    if not mv.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(mv))
    return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data)


class _Pool:
    """Page-aligned bounce buffers (anonymous mmap), one per in-flight I/O at most."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def get(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, self.size)

    def put(self, buf: mmap.mmap) -> None:
        with self._lock:
            self._free.append(buf)

    def close(self) -> None:
        with self._lock:
            for b in self._free:
                try:
                    b.close()
                except BufferError:
                    pass  # a view is still alive (e.g. in a traceback): the GC unmaps it later
            self._free.clear()


class _Slab:
    """One slab file of one size class."""

    def __init__(self, path: Path, slot_bytes: int, nslots: int) -> None:
        self.path = path
        self.slot_bytes = slot_bytes
        self.nslots = nslots
        self.stride = PAGE + _round_up(slot_bytes)
        self.fd = -1
        self.cufile: Any = None

    @property
    def file_bytes(self) -> int:
        return _DATA_START + self.nslots * self.stride

    def offset(self, slot: int) -> int:
        return _DATA_START + slot * self.stride


@dataclass(slots=True)
class _Entry:
    slab: int
    slot: int
    gen: int
    nbytes: int
    tag: bytes
    readers: int = 0
    dead: bool = False
    invalidated: bool = False
    released: bool = False
    crc: int = 0  # the payload checksum in the slot header (reads verify against it)
    state: int = 1  # the slot state, i.e. which checksum algorithm ``crc`` is


class _Pending(Reservation):
    """A reservation of the ledger plus the slot it holds (slab index, slot number)."""

    __slots__ = ("si", "slot")

    def __init__(self, key: str, nbytes: int, tag: bytes, si: int, slot: int, held: int) -> None:
        super().__init__(key, nbytes, tag, held=held)
        self.si = si
        self.slot = slot


def _envelope_options(options: Mapping[str, Any], block_bytes: int) -> dict[str, Any] | None:
    """The certification envelope's configuration for blocks of ``block_bytes``: slots of
    exactly that size (as a deployment sizes its slots to its model's block), in a
    subdirectory of ``path``. None when ``path`` is a list (several devices)."""
    path = options.get("path")
    if not isinstance(path, (str, os.PathLike)):
        return None
    # room for the envelope's full 512 MiB per storage measurement (32 to 2048 blocks; it
    # moves at most 80 % of the free capacity, in slots of block + header page): shorter
    # measurements on a shared virtual disk are mostly noise
    blocks = max(32, min(2048, (512 << 20) // max(1, block_bytes)))
    cap = max(192 << 20, blocks * (block_bytes + PAGE) * 5 // 4 + (1 << 20))
    return {
        **options,
        "path": str(Path(path) / f"envelope-{block_bytes}"),
        "slot_bytes": block_bytes,
        "capacity": cap,
    }


class NvmeBackend(Backend):
    """Persistent NVMe tier over preallocated slab files (see the module docstring).

    Options:
        path: a directory or a list of directories (one per device) for the slab files (required).
        capacity: payload bytes over all slab files (default 256 MiB), split evenly among size classes
            and directories.
        slot_bytes: one slot size or a list of size classes; a block goes to the smallest class that
            fits; ``max_block_bytes`` is the largest class. Default: the classes of the slab files
            already in ``path`` when they hold the model's block, else one class of the block size
            the core gives at open (``OpenContext.block_nbytes``, rounded up to 4 KiB), else 2 MiB.
        queue_depth: maximum I/Os in flight (default 8).
        io: how device (GPU) buffers move: ``"auto"`` (kvikio cuFile when a CUDA GPU and kvikio are
            present, else a host bounce), ``"kvikio"`` (required; PluginUnavailableError without) or
            ``"posix"``. Host buffers always use O_DIRECT ``preadv``/``pwritev``.
        checksum: ``"auto"`` (crc32c if installed), ``"crc32c"`` or ``"crc32"``; an existing slab keeps
            the algorithm it was created with.
        direct: use O_DIRECT (default true; false only for filesystems without it, e.g. tmpfs).
        prefill: write zeros over new slab files so that later writes never allocate extents (default true).

    Errors: ConfigError for bad options or a slab whose geometry differs from the options;
    PluginUnavailableError for ``io="kvikio"`` without GPU or kvikio; BackendIOError for the medium
    (including a filesystem that refuses O_DIRECT).
    """

    #: ``tierkv certify`` measures each block size on slots of that size (a deployment's)
    certification: ClassVar[CertificationProfile] = CertificationProfile(options_for_block=_envelope_options)

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(options, name=name or "nvme")
        reject_unknown(self.options, _KNOWN)
        raw_path = self.options.get("path")
        if isinstance(raw_path, (str, os.PathLike)):
            dirs = [Path(raw_path)]
        elif (
            isinstance(raw_path, (list, tuple))
            and raw_path
            and all(isinstance(p, (str, os.PathLike)) for p in raw_path)
        ):
            dirs = [Path(p) for p in raw_path]
        else:
            raise ConfigError("path", raw_path, "a directory or a non-empty list of directories")
        if len({str(d) for d in dirs}) != len(dirs):
            raise ConfigError("path", raw_path, "distinct directories")
        self._dirs = dirs
        self._capacity_opt = opt_size(self.options, "capacity", "256MiB", minimum=1)
        raw_sb = self.options.get("slot_bytes")
        self._slot_bytes_given = raw_sb is not None
        if raw_sb is None:
            classes = [_DEFAULT_SLOT_BYTES]  # until open: derived from the block size when the core gives it
        else:
            sizes = raw_sb if isinstance(raw_sb, (list, tuple)) else [raw_sb]
            if not sizes:
                raise ConfigError("slot_bytes", raw_sb, "a size or a non-empty list of sizes")
            classes = sorted({parse_size("slot_bytes", s) for s in sizes})
            if classes[0] < 1 or classes[-1] > 1 << 30:
                raise ConfigError("slot_bytes", raw_sb, "sizes between 1 byte and 1 GiB")
        self._qd = opt_int(self.options, "queue_depth", 8, minimum=1, maximum=256)
        self._io_opt = opt_choice(self.options, "io", ("auto", "kvikio", "posix"), "auto")
        self._checksum_opt = opt_choice(self.options, "checksum", ("auto", "crc32c", "crc32"), "auto")
        self._direct = opt_bool(self.options, "direct", True)
        self._prefill = opt_bool(self.options, "prefill", True)
        # reservations and the counts (a slot's whole size each); the free slots decide what fits
        self._ledger: ReservationLedger[_Pending] = ReservationLedger(tier=self.name)
        self._set_classes(classes)
        self._created: list[tuple[Path, int]] = []  # slab files this open created or initialised
        self._made_dirs: list[Path] = []  # directories this open created
        self._index: dict[str, _Entry] = {}
        self._next_gen = 1
        self._gen_lock = threading.Lock()
        self._gen_crc: dict[int, tuple[int, int]] = {}  # gen -> (state, payload crc) until committed
        self._checkpoint = 0
        self._ckpt_seen: list[int] = []
        self._unsettled: set[int] = set()
        self._poisoned: set[tuple[int, int]] = set()
        self._limiter = anyio.CapacityLimiter(self._qd)
        self._executor: ThreadPoolExecutor | None = None  # batch I/O workers, created by open
        self._hdr_pool = _Pool(_RUN_SLOTS * PAGE)  # header / scratch pages of coalesced runs
        self._checksum = "crc32"
        self._csum: Callable[[Any], int] = _checksum_fn("crc32")
        self._io_path = ""
        self._kvikio: Any = None
        self._counters = {"reads": 0, "writes": 0, "evictions": 0, "bytes_read": 0, "bytes_written": 0}
        self._recovered = {"blocks": 0, "torn_or_stale": 0, "duplicates": 0, "verified": 0}

    def _set_classes(self, classes: list[int]) -> None:
        """The slot size classes and the slab files they give (no I/O)."""
        self._classes = classes
        per_class = self._capacity_opt // len(classes)
        self._slabs: list[_Slab] = []
        for sb in classes:
            per_file = max(1, per_class // (sb * len(self._dirs)))
            for d in self._dirs:
                self._slabs.append(_Slab(d / f"tierkv-nvme-{sb}.slab", sb, per_file))
        self._capacity = sum(s.nslots * s.slot_bytes for s in self._slabs)
        self._ledger.max_block_bytes = classes[-1]
        # free slots per class, interleaved over directories so consecutive blocks go to distinct devices
        self._free: dict[int, list[tuple[int, int]]] = {sb: [] for sb in classes}
        self._pool = _Pool(PAGE + _round_up(classes[-1]))

    def _derive_classes(self) -> None:
        """Without ``slot_bytes``: the size classes of the slab files already in ``path`` when
        they hold the core's block (a store keeps its geometry), else one class of the
        block size the core gave at open (:attr:`context`), else 2 MiB."""
        if self._slot_bytes_given:
            return
        block = self.context.block_nbytes
        found: set[int] = set()
        try:
            names = os.listdir(self._dirs[0])
        except OSError:
            names = []
        for n in names:
            m = _SLAB_RE.fullmatch(n)
            if m and 0 < int(m.group(1)) <= 1 << 30:
                found.add(int(m.group(1)))
        if found and (block is None or max(found) >= block):
            classes = sorted(found)
        elif block is not None:
            if block > 1 << 30:
                raise ConfigError(
                    "slot_bytes", None, f"set explicitly: the model's block of {block} bytes is over 1 GiB"
                )
            classes = [_round_up(block)]
        else:
            return
        if classes != self._classes:
            self._set_classes(classes)

    # ----------------------------------------------------------------- declaration
    @classmethod
    def probe(cls) -> Availability:
        if not hasattr(os, "O_DIRECT") or not hasattr(os, "preadv"):
            return Availability(False, "this platform has no O_DIRECT / preadv", "run on Linux")
        ok, why = cuda_usable() if kvikio_installed() else (False, "kvikio not installed")
        if ok:
            return Availability(True, "kvikio cuFile available")
        return Availability(True, f"O_DIRECT preadv/pwritev ({why})")

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        return {"path": str(workdir / "nvme"), "capacity": "256MiB", "slot_bytes": "2MiB"}

    #: the envelope's configuration for blocks of a size (:attr:`certification`)
    envelope_options = staticmethod(_envelope_options)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            tier_kind=TierKind.NVME,
            persistent=True,
            alignment=PAGE,
            max_block_bytes=self._classes[-1],
            max_concurrency=self._qd,
        )

    # ------------------------------------------------------------------- lifecycle
    async def _open(self) -> None:
        use_kvikio = False
        if self._io_opt in ("auto", "kvikio"):
            ok, why = cuda_usable() if kvikio_installed() else (False, "kvikio is not installed")
            if ok:
                use_kvikio = True
            elif self._io_opt == "kvikio":
                raise PluginUnavailableError(
                    f"nvme io='kvikio' is unavailable: {why}",
                    group="tierkv.backends",
                    name=self.name,
                    hint="install the gds extra (kvikio-cu12) on a machine with an NVIDIA GPU, or use io='posix'",
                )
        try:
            await anyio.to_thread.run_sync(self._derive_classes, limiter=self._limiter)
            await anyio.to_thread.run_sync(self._open_files, limiter=self._limiter)
            if use_kvikio:
                await anyio.to_thread.run_sync(self._open_kvikio, limiter=self._limiter)
            await anyio.to_thread.run_sync(self._recover, limiter=self._limiter)
            self._executor = ThreadPoolExecutor(self._qd, thread_name_prefix=f"tierkv-{self.name}")
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._close_files)
                await anyio.to_thread.run_sync(self._undo_create)
            if isinstance(exc, OSError) and not isinstance(exc, TierKVError):
                raise os_error(exc, f"cannot open the slab files in {self._dirs[0]}", tier=self.name) from exc
            raise
        self._created.clear()
        self._made_dirs.clear()

    def _undo_create(self) -> None:
        """After a failed open: remove the slab files this open created (and the directories
        it made, when empty) and give files it initialised their old size back; files that
        were there before with a valid geometry are never touched."""
        for path, old_size in reversed(self._created):
            try:
                if old_size < 0:
                    os.unlink(path)
                else:
                    os.truncate(path, old_size)
            except OSError:
                pass
        for d in reversed(self._made_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        self._created.clear()
        self._made_dirs.clear()

    def _open_kvikio(self) -> None:
        import kvikio

        compat = True
        try:
            compat = bool(kvikio.defaults.is_compat_mode_preferred())
        except AttributeError:
            try:
                compat = str(kvikio.defaults.compat_mode()).upper().endswith("ON")
            except AttributeError:
                compat = True
        for s in self._slabs:
            s.cufile = kvikio.CuFile(str(s.path), "r+")
        self._kvikio = kvikio
        mode = "compat mode, POSIX" if compat else "GDS"
        self._io_path = f"{self._io_path}; device buffers: kvikio cuFile ({mode})"

    def _open_files(self) -> None:
        want = _CHECKSUMS[2] if self._checksum_opt == "crc32c" else _CHECKSUMS[1]
        if self._checksum_opt == "auto":
            want = "crc32c" if _crc32c_available() else "crc32"
        chosen: str | None = None
        flags = os.O_RDWR | (os.O_DIRECT if self._direct else 0)
        for d in self._dirs:
            missing = [p for p in (d, *d.parents) if not p.exists()]
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise os_error(exc, f"cannot create directory {d}", tier=self.name) from exc
            self._made_dirs.extend(reversed(missing))
        for s in self._slabs:
            exists = s.path.exists()
            try:
                s.fd = os.open(s.path, flags | os.O_CREAT, 0o644)
            except OSError as exc:
                if exc.errno == errno.EINVAL and self._direct:
                    raise BackendIOError(
                        f"{s.path.parent} does not support O_DIRECT (tmpfs?); use a real filesystem or direct=false",
                        tier=self.name,
                    ) from exc
                raise os_error(exc, f"cannot open {s.path}", tier=self.name) from exc
            if not exists:
                self._created.append((s.path, -1))
            try:
                size = os.fstat(s.fd).st_size
                algo = self._read_geometry(s) if exists and size >= PAGE else None
                if algo is None:
                    algo = chosen or want
                    if exists:
                        self._created.append((s.path, size))  # never finished initialising: recreated
                    self._check_room(s)
                    self._create(s, algo)
            except OSError as exc:
                raise os_error(exc, f"cannot initialise {s.path}", tier=self.name) from exc
            if chosen is not None and algo != chosen:
                raise ConfigError("checksum", algo, f"one algorithm for all slab files (others use {chosen})")
            chosen = algo
        assert chosen is not None
        if chosen == "crc32c" and not _crc32c_available():
            raise PluginUnavailableError(
                "slab files use crc32c but the crc32c package is not installed",
                group="tierkv.backends",
                name=self.name,
                hint="pip install crc32c",
            )
        self._checksum = chosen
        self._csum = _checksum_fn(chosen)
        self._io_path = "O_DIRECT preadv/pwritev" if self._direct else "buffered preadv/pwritev + fdatasync"

    def _read_page(self, s: _Slab, off: int) -> bytes:
        buf = self._pool.get()
        try:
            mv = memoryview(buf)[:PAGE]
            n = os.preadv(s.fd, [mv], off)
            return bytes(mv[:n])
        finally:
            self._pool.put(buf)

    def _write_page(self, s: _Slab, off: int, data: bytes) -> None:
        buf = self._pool.get()
        try:
            buf[: len(data)] = data
            mv = memoryview(buf)[:PAGE]
            if os.pwritev(s.fd, [mv], off) != PAGE:
                raise OSError(errno.EIO, "short write")
        finally:
            self._pool.put(buf)

    def _read_geometry(self, s: _Slab) -> str | None:
        g = _unseal(self._read_page(s, 0), _GEOM)
        if g is None or g[0] != _GEOM_MAGIC:
            return None  # never finished initialising: recreate
        _, version, algo_id, slot_bytes, nslots, stride = g
        if version != _VERSION or algo_id not in _CHECKSUMS:
            raise ConfigError("path", str(s.path), f"a slab file of format version {_VERSION}")
        if slot_bytes != s.slot_bytes or nslots != s.nslots or stride != s.stride:
            raise ConfigError(
                "capacity",
                self.options.get("capacity"),
                f"the geometry of the existing {s.path.name} (slot_bytes={slot_bytes}, nslots={nslots}); "
                "use the same capacity/slot_bytes/path or a new directory",
            )
        ck = _unseal(self._read_page(s, PAGE), _CKPT)
        # a torn checkpoint record means: verify every payload (-1)
        self._ckpt_seen.append(ck[1] if ck is not None and ck[0] == _CKPT_MAGIC else -1)
        return _CHECKSUMS[algo_id]

    def _check_room(self, s: _Slab) -> None:
        """Refuse (CapacityError, before writing it) a new slab file that its filesystem has
        no room for (a failed open then removes the slab files it created before)."""
        if not self._prefill:
            return  # sparse: blocks take room as they are written (a full disk fails a write then)
        st = os.fstatvfs(s.fd)
        need = s.file_bytes - os.fstat(s.fd).st_size  # the slab files created before are in f_bavail
        free = st.f_bavail * st.f_frsize
        if need > free:
            raise CapacityError(
                f"capacity={self._capacity_opt} needs a {s.file_bytes}-byte slab file {s.path.name} but "
                f"{s.path.parent} has {free} bytes free: lower capacity or free space",
                tier=self.name,
            )

    def _create(self, s: _Slab, algo: str) -> None:
        os.ftruncate(s.fd, 0)
        os.ftruncate(s.fd, s.file_bytes)
        if self._prefill:
            chunk = 8 << 20
            zero = mmap.mmap(-1, chunk)
            try:
                off = 0
                while off < s.file_bytes:
                    n = min(chunk, s.file_bytes - off)
                    os.pwritev(s.fd, [memoryview(zero)[:n]], off)
                    off += n
            finally:
                zero.close()
        else:
            free = pack_slot_header(SlotHeader(_STATE_FREE, 0, "", 0, b"", 0))
            for i in range(s.nslots):
                self._write_page(s, s.offset(i), free)
        self._write_page(s, PAGE, _sealed(_CKPT.pack(_CKPT_MAGIC, 0)))
        os.fsync(s.fd)
        algo_id = next(k for k, v in _CHECKSUMS.items() if v == algo)
        self._write_page(s, 0, _sealed(_GEOM.pack(_GEOM_MAGIC, _VERSION, algo_id, s.slot_bytes, s.nslots, s.stride)))
        os.fsync(s.fd)
        dfd = os.open(s.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _recover(self) -> None:
        """Rebuild the index from the slot headers (see the module docstring)."""
        # the files' checkpoints are written in turn: the smallest one is true for all
        ckpt = min(self._ckpt_seen) if self._ckpt_seen else 0
        best: dict[str, tuple[int, int, SlotHeader]] = {}
        bad: list[tuple[int, int]] = []
        free: list[tuple[int, int]] = []
        max_gen = max(ckpt, 0)
        for si, s in enumerate(self._slabs):
            for slot in range(s.nslots):
                h = unpack_slot_header(self._read_page(s, s.offset(slot)))
                if h is not None:
                    max_gen = max(max_gen, h.gen)
                if h is None or h.state not in _COMMITTED:
                    free.append((si, slot))
                    continue
                ok = h.nbytes <= s.slot_bytes
                if ok and (ckpt < 0 or h.gen > ckpt):
                    ok = self._verify_payload(s, slot, h)
                    self._recovered["verified"] += 1
                if not ok:
                    self._recovered["torn_or_stale"] += 1
                    bad.append((si, slot))
                    continue
                prev = best.get(h.key)
                if prev is not None:
                    self._recovered["duplicates"] += 1
                    loser = prev if prev[2].gen < h.gen else (si, slot, h)
                    bad.append((loser[0], loser[1]))
                    if prev[2].gen > h.gen:
                        continue
                best[h.key] = (si, slot, h)
        self._next_gen = max_gen + 1
        touched: set[int] = set()
        for si, slot in bad:
            s = self._slabs[si]
            self._write_page(s, s.offset(slot), self._free_header())
            touched.add(si)
            free.append((si, slot))
        for si in touched:
            os.fdatasync(self._slabs[si].fd)
        for key, (si, slot, h) in best.items():
            self._index[key] = _Entry(si, slot, h.gen, h.nbytes, h.tag, crc=h.payload_crc, state=h.state)
            self._ledger.restore(h.nbytes, self._held(si, h.nbytes))
        self._recovered["blocks"] = len(best)
        # free slots are min-heaps on (slot, slab): allocation takes the lowest slot number,
        # interleaved over directories, so a batch writes ascending offsets whatever order
        # blocks were evicted in (sequential I/O; measured here: LIFO reuse of slots freed in
        # ascending order halved 256 KiB batch writes)
        for si, slot in free:
            self._free[self._slabs[si].slot_bytes].append((slot, si))
        for heap in self._free.values():
            heapq.heapify(heap)
        self._write_checkpoint(self._next_gen - 1)

    def _settle(self, gen: int) -> None:
        self._unsettled.discard(gen)
        self._gen_crc.pop(gen, None)

    def _take_gen(self) -> int:
        with self._gen_lock:
            gen = self._next_gen
            self._next_gen += 1
            return gen

    def _free_header(self) -> bytes:
        gen = self._take_gen()
        return pack_slot_header(SlotHeader(_STATE_FREE, gen, "", 0, b"", 0))

    def _write_checkpoint(self, gen: int) -> None:
        rec = _sealed(_CKPT.pack(_CKPT_MAGIC, max(gen, 0)))
        for s in self._slabs:
            self._write_page(s, PAGE, rec)
            os.fdatasync(s.fd)
        self._checkpoint = max(gen, 0)

    def _verify_payload(self, s: _Slab, slot: int, h: SlotHeader) -> bool:
        buf = self._pool.get()
        try:
            n = _round_up(h.nbytes)
            mv = memoryview(buf)[: PAGE + n]
            if os.preadv(s.fd, [mv], s.offset(slot)) != PAGE + n:
                return False
            payload = mv[PAGE : PAGE + h.nbytes]
            return unpack_slot_header(mv[:PAGE]) == h and self._csum_for(h.state)(payload) == h.payload_crc
        finally:
            self._pool.put(buf)

    async def _close(self) -> None:
        self._ledger.clear()  # in-flight writes see their reservation gone and undo themselves
        # wait for every in-flight I/O: take all the limiter's tokens
        tokens = [object() for _ in range(self._qd)]
        with anyio.CancelScope(shield=True):
            for t in tokens:
                await self._limiter.acquire_on_behalf_of(t)
            try:
                if any(s.fd >= 0 for s in self._slabs):
                    settled = (min(self._unsettled) - 1) if self._unsettled else self._next_gen - 1
                    try:
                        await anyio.to_thread.run_sync(self._write_checkpoint, settled)
                    except OSError:
                        pass  # the next open verifies more payloads; nothing is lost
                await anyio.to_thread.run_sync(self._close_files)
            finally:
                for t in tokens:
                    self._limiter.release_on_behalf_of(t)

    def _close_files(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for s in self._slabs:
            if s.cufile is not None:
                try:
                    s.cufile.close()
                except Exception:
                    pass
                s.cufile = None
            if s.fd >= 0:
                os.close(s.fd)
                s.fd = -1
        self._pool.close()
        self._hdr_pool.close()

    # ------------------------------------------------------------------- raw I/O
    # Host buffers always move with O_DIRECT preadv/pwritev: kvikio's cuFile would only add its
    # own bounce buffers for host memory (measured on an H200 machine: reads at 0.4-0.5x of raw
    # preadv). cuFile moves device buffers (write_device / read_device).
    def _pwritev(self, s: _Slab, iovs: list[memoryview], off: int) -> int:
        done = os.pwritev(s.fd, iovs, off)
        total = sum(len(v) for v in iovs)
        while 0 < done < total:
            # a short write (a filling disk): write the rest, which raises the reason (ENOSPC)
            n = os.pwritev(s.fd, _skip(iovs, done), off + done)
            if n <= 0:
                break
            done += n
        return done

    def _preadv(self, s: _Slab, iovs: list[memoryview], off: int) -> int:
        return os.preadv(s.fd, iovs, off)

    def _sync(self, s: _Slab) -> None:
        os.fdatasync(s.fd)

    def _write_slot(self, si: int, slot: int, gen: int, key: str, tag: bytes, data: memoryview) -> None:
        self._put_slot(si, slot, self._committed_header(gen, key, tag, data), data)
        self._sync(self._slabs[si])

    def _csum_for(self, state: int) -> Callable[[Any], int]:
        return wsum32 if state == _STATE_COMMITTED_WSUM else self._csum

    def _committed_header(self, gen: int, key: str, tag: bytes, data: memoryview) -> bytes:
        """The slot header of a block (computes the payload checksum: CPU work, no I/O); the
        checksum is kept for the index entry (reads verify against it without the header)."""
        crc = self._csum(data)
        self._gen_crc[gen] = (_STATE_COMMITTED, crc)
        return pack_slot_header(SlotHeader(_STATE_COMMITTED, gen, key, len(data), tag, crc))

    def _entry(self, si: int, slot: int, gen: int, nbytes: int, tag: bytes) -> _Entry:
        """The index entry of a block just committed under ``gen`` (its header was made by
        :meth:`_committed_header` or :meth:`_write_slot_device`, which kept the checksum)."""
        state, crc = self._gen_crc.pop(gen)
        return _Entry(si, slot, gen, nbytes, tag, crc=crc, state=state)

    def _put_slot(self, si: int, slot: int, hdr: bytes, data: memoryview) -> None:
        """One O_DIRECT pwritev of header + payload into the slot, without fdatasync."""
        s = self._slabs[si]
        n = len(data)
        buf = self._pool.get()
        try:
            buf[: len(hdr)] = hdr
            bmv = memoryview(buf)
            full = n // PAGE * PAGE
            if full and _addr(data) % PAGE == 0:
                iovs = [bmv[:PAGE], data[:full]]
                tail = n - full
                if tail:
                    bmv[PAGE : PAGE + tail] = data[full:]
                    iovs.append(bmv[PAGE : 2 * PAGE])
            else:
                if n:
                    bmv[PAGE : PAGE + n] = data
                iovs = [bmv[: PAGE + _round_up(n)]]
            total = sum(len(v) for v in iovs)
            if self._pwritev(s, iovs, s.offset(slot)) != total:
                raise OSError(errno.EIO, "short write")
        finally:
            self._pool.put(buf)

    def _read_slot(self, e: _Entry, key: str, into: memoryview | None) -> memoryview:
        return self._verify_known(e, key, self._read_payload(e, into))

    def _read_payload(self, e: _Entry, into: memoryview | None) -> memoryview:
        """Read the payload only, one iovec straight into a page-aligned caller buffer where
        possible (the checksum to verify is in the index entry)."""
        s = self._slabs[e.slab]
        n = e.nbytes
        if n == 0:
            return memoryview(b"")
        off = s.offset(e.slot) + PAGE
        rn = _round_up(n)
        full = n // PAGE * PAGE
        if into is None:
            out = memoryview(mmap.mmap(-1, rn))
            if self._preadv(s, [out], off) != rn:
                raise OSError(errno.EIO, "short read")
            return out[:n]
        if full == n and _addr(into) % PAGE == 0:
            if self._preadv(s, [into[:n]], off) != n:
                raise OSError(errno.EIO, "short read")
            return into[:n]
        buf = self._pool.get()
        try:
            bmv = memoryview(buf)
            if full and _addr(into) % PAGE == 0:
                if self._preadv(s, [into[:full], bmv[:PAGE]], off) != full + PAGE:
                    raise OSError(errno.EIO, "short read")
                into[full:n] = bmv[: n - full]
            else:
                if self._preadv(s, [bmv[:rn]], off) != rn:
                    raise OSError(errno.EIO, "short read")
                into[:n] = bmv[:n]
            return into[:n]
        finally:
            self._pool.put(buf)

    def _verify_known(self, e: _Entry, key: str, out: memoryview) -> memoryview:
        if self._csum_for(e.state)(out) != e.crc:
            raise IntegrityError(f"payload checksum mismatch for {key!r}", tier=self.name)
        return out

    def _invalidate(self, si: int, slot: int) -> None:
        self._put_free_header(si, slot)
        self._sync(self._slabs[si])

    def _put_free_header(self, si: int, slot: int) -> None:
        s = self._slabs[si]
        hdr = self._free_header()
        buf = self._pool.get()
        try:
            buf[: len(hdr)] = hdr
            if self._pwritev(s, [memoryview(buf)[:PAGE]], s.offset(slot)) != PAGE:
                raise OSError(errno.EIO, "short write")
        finally:
            self._pool.put(buf)

    # ------------------------------------------------------------ batch workers
    def _run_jobs(self, jobs: list[Callable[[], Any]]) -> list[Any]:
        """Run ``jobs`` (see :meth:`_chunked`); each result is its value or the exception it raised."""
        return self._chunked(len(jobs), lambda i: jobs[i]())

    def _sync_slabs(self, sis: set[int]) -> dict[int, BaseException]:
        """fdatasync each slab file in ``sis`` (in parallel); the failures by slab."""
        order = sorted(sis)
        res = self._run_jobs([partial(self._sync, self._slabs[si]) for si in order])
        return {si: r for si, r in zip(order, res, strict=True) if isinstance(r, BaseException)}

    def _chunked(self, n: int, run: Callable[[int], Any]) -> list[Any]:
        """``run(i)`` for i in range(n), in up to ``queue_depth`` worker threads that each take
        indices in turn (one future per worker, not per block: the per-block cost of a small
        block stays a few microseconds). Per index its value or the exception it raised;
        always waits for every call (never abandons an I/O)."""
        ex = self._executor
        res: list[Any] = [None] * n
        next_i = iter(range(n))
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    i = next(next_i, None)
                if i is None:
                    return
                try:
                    res[i] = run(i)
                except Exception as exc:
                    res[i] = exc

        workers = min(self._qd, n)
        if ex is None or workers <= 1:
            worker()
            return res
        # the executor's queue_depth threads do all the I/O (this thread only waits), so
        # concurrent batches together never have more than queue_depth I/Os in flight
        futs = [ex.submit(worker) for _ in range(workers)]
        wait_futures(futs)
        for f in futs:
            err = f.exception()
            if err is not None:  # only BaseException subclasses outside Exception get here
                raise err
        return res

    def _write_batch(self, jobs: list[tuple[int, int, int, str, bytes, memoryview]]) -> list[BaseException | None]:
        """Header (payload checksum) and data write of every block, then one fdatasync per slab
        touched; per-block error or None. Blocks that fill whole adjacent slots from page-aligned
        buffers go in coalesced runs (one ``pwritev`` of header and payload iovecs per run, see
        :func:`_coalesce`); up to ``queue_depth`` I/Os in flight. A failed run fails its blocks."""
        plan = _coalesce(
            [(j[0], j[1]) if self._whole_slot(j[0], j[5]) else None for j in jobs],
            lambda si: self._slabs[si].stride,
            self._qd,
        )

        def one(u: int) -> None:
            group = plan[u]
            if len(group) == 1:
                si, slot, gen, key, tag, mv = jobs[group[0]]
                self._put_slot(si, slot, self._committed_header(gen, key, tag, mv), mv)
            else:
                self._put_run([jobs[i] for i in group])

        res: list[BaseException | None] = self._chunked(len(plan), one)
        errs: list[BaseException | None] = [None] * len(jobs)
        for group, r in zip(plan, res, strict=True):
            for i in group:
                errs[i] = r
        failed = self._sync_slabs({j[0] for j, e in zip(jobs, errs, strict=True) if e is None})
        return [e if e is not None else failed.get(j[0]) for j, e in zip(jobs, errs, strict=True)]

    def _whole_slot(self, si: int, mv: memoryview | None) -> bool:
        """Whether ``mv`` covers its slot's whole payload area from a page-aligned address (so
        that adjacent slots form one contiguous file range with it)."""
        return mv is not None and len(mv) == self._slabs[si].stride - PAGE and _addr(mv) % PAGE == 0

    def _put_run(self, run: list[tuple[int, int, int, str, bytes, memoryview]]) -> None:
        """One O_DIRECT ``pwritev`` of adjacent whole slots (header page + payload each), no fdatasync."""
        s = self._slabs[run[0][0]]
        hdrs = self._hdr_pool.get()
        try:
            hv = memoryview(hdrs)
            iovs: list[memoryview] = []
            for k, (_, _, gen, key, tag, mv) in enumerate(run):
                page = hv[k * PAGE : (k + 1) * PAGE]
                hdr = self._committed_header(gen, key, tag, mv)
                page[: len(hdr)] = hdr
                iovs += (page, mv)
            if self._pwritev(s, iovs, s.offset(run[0][1])) != len(run) * s.stride:
                raise OSError(errno.EIO, "short write")
        finally:
            self._hdr_pool.put(hdrs)

    def _get_run(self, run: list[tuple[_Entry, str, memoryview | None]]) -> list[Any]:
        """One O_DIRECT ``preadv`` of the payloads of adjacent whole slots straight into their
        page-aligned buffers (the header pages between them go to scratch pages), then each
        block verified against its indexed checksum; per block its view or IntegrityError."""
        e0 = run[0][0]
        s = self._slabs[e0.slab]
        scratch = self._hdr_pool.get()
        try:
            sv = memoryview(scratch)
            iovs: list[memoryview] = []
            for k, (e, _, into) in enumerate(run):
                assert into is not None
                if k:
                    iovs.append(sv[k * PAGE : (k + 1) * PAGE])
                iovs.append(into[: e.nbytes])
            want = len(run) * s.stride - PAGE
            if self._preadv(s, iovs, s.offset(e0.slot) + PAGE) != want:
                raise OSError(errno.EIO, "short read")
        finally:
            self._hdr_pool.put(scratch)
        out: list[Any] = []
        for e, key, into in run:
            assert into is not None
            try:
                out.append(self._verify_known(e, key, into[: e.nbytes]))
            except IntegrityError as exc:
                out.append(exc)
        return out

    def _invalidate_batch(self, slots: list[tuple[int, int]]) -> list[bool]:
        """Free headers over every slot, then one fdatasync per slab; per slot whether it is durably free."""
        res = self._run_jobs([partial(self._put_free_header, *t) for t in slots])
        ok = [not isinstance(r, BaseException) for r in res]
        failed = self._sync_slabs({t[0] for t, g in zip(slots, ok, strict=True) if g})
        return [g and t[0] not in failed for t, g in zip(slots, ok, strict=True)]

    def _read_batch(self, jobs: list[tuple[_Entry, str, memoryview | None]]) -> list[Any]:
        """Per block its verified view or the exception; up to ``queue_depth`` reads in flight,
        each verified by the thread that read it. Whole adjacent slots read into page-aligned
        buffers go in coalesced runs (one ``preadv`` per run, see :func:`_coalesce`)."""
        plan = _coalesce(
            [
                (e.slab, e.slot)
                if e.nbytes and self._whole_slot(e.slab, None if into is None else into[: e.nbytes])
                else None
                for e, _, into in jobs
            ],
            lambda si: self._slabs[si].stride,
            self._qd,
        )

        def one(u: int) -> list[Any]:
            group = plan[u]
            if len(group) == 1:
                return [self._read_slot(*jobs[group[0]])]
            return self._get_run([jobs[i] for i in group])

        res = self._chunked(len(plan), one)
        out: list[Any] = [None] * len(jobs)
        for group, r in zip(plan, res, strict=True):
            for k, i in enumerate(group):
                out[i] = r if isinstance(r, BaseException) else r[k]
        return out

    async def _invalidate_shielded(self, si: int, slot: int) -> bool:
        """Durably free a slot; on failure the slot is poisoned (never reused in this process)."""
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(self._invalidate, si, slot, limiter=self._limiter)
            except OSError:
                self._poisoned.add((si, slot))
                return False
        return True

    def _release_slot(self, si: int, slot: int) -> None:
        if (si, slot) not in self._poisoned:
            heapq.heappush(self._free[self._slabs[si].slot_bytes], (slot, si))

    # ---------------------------------------------------------------------- data
    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        """Reserve a slot of the smallest class that fits. Raises InputError, BlockExistsError,
        CapacityError (no free slot of a fitting class, or capacity exhausted), BackendClosedError."""
        self._check_open()
        return self._allocate_now(key, nbytes, tag)

    def _allocate_now(self, key: str, nbytes: int, tag: bytes) -> Allocation:
        self._ledger.check(key, nbytes, tag, committed=self._index)
        for sb in self._classes:
            if sb >= nbytes and self._free[sb]:
                slot, si = heapq.heappop(self._free[sb])
                break
        else:
            raise CapacityError(f"no free slot for a block of {nbytes} bytes", tier=self.name)
        return self._ledger.add(_Pending(key, nbytes, bytes(tag), si, slot, self._held(si, nbytes)))

    def _held(self, si: int, nbytes: int) -> int:
        """Bytes a block counts in ``used_bytes``: its whole slot (0 for an empty block)."""
        return self._slabs[si].slot_bytes if nbytes else 0

    def _drop(self, key: str) -> bool:
        """Evict the reservation under ``key`` (True if there was one); its slot goes back to
        the free list unless a write of it is in flight (that write frees it, durably)."""
        r = self._ledger.drop(key)
        if r is None:
            return False
        if not r.writing:  # an idle reservation never touched the disk
            self._release_slot(r.si, r.slot)
        return True

    def _reject(self, r: _Pending) -> None:
        """A write refused before any I/O (its data, its batch): the reservation and slot go."""
        if self._ledger.abort(r):
            self._release_slot(r.si, r.slot)

    def _publish(self, r: _Pending, gen: int) -> None:
        """Index a block whose write (generation ``gen``) succeeded and whose reservation
        the ledger just committed."""
        self._index[r.key] = self._entry(r.si, r.slot, gen, r.nbytes, r.tag)
        self._settle(gen)
        self._counters["writes"] += 1
        self._counters["bytes_written"] += r.nbytes

    def _hide(self, key: str, e: _Entry) -> None:
        """Take a committed block out of the index and the counts; its slot is freed once
        it is durably invalidated and no read uses it."""
        del self._index[key]
        self._ledger.release(e.nbytes, self._held(e.slab, e.nbytes))
        e.dead = True

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        """Write and commit durably (one O_DIRECT write of header + payload, then fdatasync).

        Raises InputError (the reservation is released), BlockNotFoundError (unknown allocation,
        or evicted while in flight), BackendIOError, BackendClosedError. On failure or
        cancellation the slot is durably invalidated (shielded) and the reservation released.
        """
        self._check_open()
        r = self._ledger.claim(allocation)
        try:
            mv = as_byte_view(data)
            if len(mv) != r.nbytes:
                raise InputError(f"[{self.name}] write of {len(mv)} bytes into a {r.nbytes}-byte allocation")
        except InputError:
            self._reject(r)
            raise
        await self._commit_one(r, partial(self._write_slot, data=mv), (OSError,), "write")

    async def _commit_one(
        self, a: _Pending, io: Callable[..., None], io_errors: tuple[type[BaseException], ...], what: str
    ) -> None:
        """Run ``io(si, slot, gen, key, tag)`` for the claimed reservation ``a`` in a worker
        thread and commit the block; on failure, cancellation or a concurrent evict the slot
        is durably invalidated (shielded) before it is reused. ``io_errors`` become
        BackendIOError."""
        si, slot = a.si, a.slot
        gen = self._take_gen()
        self._unsettled.add(gen)
        try:
            await anyio.to_thread.run_sync(io, si, slot, gen, a.key, a.tag, limiter=self._limiter)
        except BaseException as exc:
            self._ledger.abort(a)
            # the write may have reached the medium: free the slot durably before it is reused
            if await self._invalidate_shielded(si, slot):
                self._settle(gen)
            self._release_slot(si, slot)
            if isinstance(exc, OSError) and not isinstance(exc, TierKVError):
                raise os_error(exc, f"{what} of {a.key!r}", tier=self.name) from exc
            if isinstance(exc, io_errors):
                raise BackendIOError(f"{what} of {a.key!r} failed: {exc}", tier=self.name) from exc
            raise
        if not self._ledger.commit(a):
            # evicted (or closed) while in flight: the slot goes back only once it is durably free again
            if await self._invalidate_shielded(si, slot):
                self._settle(gen)
            self._release_slot(si, slot)
            raise BlockNotFoundError(f"reservation for {a.key!r} was dropped during write", tier=self.name)
        self._publish(a, gen)

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        """Read and verify (header generation + payload checksum). Raises BlockNotFoundError,
        InputError, IntegrityError (block quarantined: invalidated and removed), BackendIOError."""
        self._check_open()
        validate_key(key, tier=self.name)
        e = self._index.get(key)
        if e is None:
            raise BlockNotFoundError(f"no block {key!r}", tier=self.name)
        dst: memoryview | None = None
        if into is not None:
            dst = into_view(into, e.nbytes, tier=self.name)
        # a read into this call's own buffer is abandoned by a cancelled caller (the thread
        # finishes into that buffer, then it is dropped); into the caller's it is waited for
        out = await self._read_pinned(
            e,
            key,
            "read",
            lambda: run_blocking(self._read_slot, e, key, dst, limiter=self._limiter, abandon_on_cancel=dst is None),
        )
        self._counters["reads"] += 1
        self._counters["bytes_read"] += e.nbytes
        return out

    async def _read_pinned(self, e: _Entry, key: str, what: str, read: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``read()`` with ``e`` pinned (an evict meanwhile frees its slot only after).
        A block failing verification is quarantined (removed) and IntegrityError raised;
        one evicted meanwhile is BlockNotFoundError; OS and device errors are translated."""
        e.readers += 1
        try:
            return await read()
        except IntegrityError:
            if self._index.get(key) is e:
                await self._remove(key, e)
                raise
            raise BlockNotFoundError(f"block {key!r} was evicted during read", tier=self.name) from None
        except OSError as exc:
            raise os_error(exc, f"{what} of {key!r}", tier=self.name) from exc
        except RuntimeError as exc:  # a device copy (torch, kvikio)
            raise BackendIOError(f"{what} of {key!r} failed: {exc}", tier=self.name) from exc
        finally:
            e.readers -= 1
            self._maybe_free(e)

    # ------------------------------------------------------------- device I/O
    def _device_bytes(self, t: Any, nbytes: int, what: str, *, writable: bool) -> Any:
        """A flat uint8 view of a contiguous CUDA tensor of (at least, when ``writable``) ``nbytes``."""
        import torch

        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            raise InputError(f"[{self.name}] {what} must be a CUDA tensor, got {type(t).__name__}")
        if not t.is_contiguous():
            raise InputError(f"[{self.name}] {what} must be contiguous")
        flat = t.reshape(-1) if t.dtype == torch.uint8 else t.reshape(-1).view(torch.uint8)
        have = int(flat.numel())
        if (writable and have < nbytes) or (not writable and have != nbytes):
            raise InputError(f"[{self.name}] {what} has {have} bytes, the block needs {nbytes}")
        return flat[:nbytes]

    def _write_slot_device(self, si: int, slot: int, gen: int, key: str, tag: bytes, src: Any) -> None:
        """kvikio: the payload goes from device memory to the file through cuFile (GDS when
        enabled), the header (wsum32 computed on the device) through the host; then fdatasync."""
        s = self._slabs[si]
        n = int(src.numel())
        crc = wsum32_torch(src)
        self._gen_crc[gen] = (_STATE_COMMITTED_WSUM, crc)
        hdr = pack_slot_header(SlotHeader(_STATE_COMMITTED_WSUM, gen, key, n, tag, crc))
        if n and int(s.cufile.pwrite(src, n, s.offset(slot) + PAGE).get()) != n:
            raise OSError(errno.EIO, "short write")
        self._write_page(s, s.offset(slot), hdr)
        self._sync(s)

    def _read_slot_device(self, e: _Entry, key: str, dst: Any) -> Any:
        """kvikio: the payload from the file into device memory through cuFile, verified against
        the indexed checksum on the device (wsum32) or, for a block written from the host, by
        its crc over a host copy."""
        s = self._slabs[e.slab]
        if e.nbytes and int(s.cufile.pread(dst, e.nbytes, s.offset(e.slot) + PAGE).get()) != e.nbytes:
            raise OSError(errno.EIO, "short read")
        got = wsum32_torch(dst) if e.state == _STATE_COMMITTED_WSUM else self._csum(dst.cpu().numpy())
        if got != e.crc:
            raise IntegrityError(f"payload checksum mismatch for {key!r}", tier=self.name)
        return dst

    async def write_device(self, allocation: Allocation, tensor: Any) -> None:
        """Write and commit a block from a contiguous CUDA tensor of exactly ``allocation.nbytes`` bytes.

        With ``io="kvikio"`` the payload moves device -> file through kvikio's ``CuFile`` (GPUDirect
        Storage when cuFile is enabled, kvikio's POSIX compatibility mode otherwise) and its checksum
        (:func:`wsum32`) is computed on the device; with the POSIX path the tensor is copied to host
        memory and written like :meth:`write`. Same durability, errors and cancellation as :meth:`write`.
        """
        self._check_open()
        a = self._ledger.get(allocation.key) if isinstance(allocation, Allocation) else None
        if a is None or a.handle != allocation.handle or a.writing:
            raise BlockNotFoundError(f"no reservation for {allocation!r}", tier=self.name)
        src = self._device_bytes(tensor, a.nbytes, "tensor", writable=False)  # refused: the reservation stays
        if self._kvikio is None:
            host = await anyio.to_thread.run_sync(lambda: src.cpu().numpy(), limiter=self._limiter)
            await self.write(allocation, host)
            return
        a = self._ledger.claim(allocation)
        await self._commit_one(a, partial(self._write_slot_device, src=src), (OSError, RuntimeError), "device write")

    async def read_device(self, key: str, *, into: Any) -> Any:
        """Read and verify a block into a contiguous CUDA tensor of at least its size; returns the
        first ``nbytes`` bytes of ``into`` as a uint8 view.

        With ``io="kvikio"`` the payload moves file -> device through ``CuFile``; with the POSIX
        path it is read into host memory, verified, then copied to the device. Errors as :meth:`read`.
        """
        self._check_open()
        validate_key(key, tier=self.name)
        e = self._index.get(key)
        if e is None:
            raise BlockNotFoundError(f"no block {key!r}", tier=self.name)
        dst = self._device_bytes(into, e.nbytes, "into", writable=True)
        if self._kvikio is None:
            host = await self.read(key)
            await anyio.to_thread.run_sync(
                lambda: dst.copy_(self._torch_from(host)) if e.nbytes else None, limiter=self._limiter
            )
            return dst
        await self._read_pinned(
            e,
            key,
            "device read",
            lambda: anyio.to_thread.run_sync(self._read_slot_device, e, key, dst, limiter=self._limiter),
        )
        self._counters["reads"] += 1
        self._counters["bytes_read"] += e.nbytes
        return dst

    @staticmethod
    def _torch_from(mv: memoryview) -> Any:
        import torch

        return torch.from_numpy(np.frombuffer(mv, dtype=np.uint8))

    def _maybe_free(self, e: _Entry) -> None:
        if e.dead and e.invalidated and e.readers == 0 and not e.released:
            e.released = True
            self._release_slot(e.slab, e.slot)

    async def _remove(self, key: str, e: _Entry) -> None:
        self._hide(key, e)
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(self._invalidate, e.slab, e.slot, limiter=self._limiter)
            except OSError as exc:
                self._poisoned.add((e.slab, e.slot))
                raise os_error(exc, f"evict of {key!r}", tier=self.name) from exc
        e.invalidated = True
        self._maybe_free(e)

    async def evict(self, key: str) -> bool:
        """Remove durably (the slot header is overwritten with a free record and synced before
        returning). Idempotent. Raises InputError, BackendClosedError, BackendIOError."""
        self._check_open()
        validate_key(key, tier=self.name)
        if self._drop(key):
            return True
        e = self._index.get(key)
        if e is None:
            return False
        await self._remove(key, e)
        self._counters["evictions"] += 1
        return True

    # -------------------------------------------------------------- batch twins
    async def allocate_many(self, items: Sequence[tuple[str, int, bytes]]) -> list[Allocation]:
        """Reserve every block, all or nothing (no I/O, no await in between): on an error the
        reservations already made by this call are dropped and the error is raised."""
        self._check_open()
        done: list[Allocation] = []
        try:
            for key, nbytes, tag in items:
                done.append(self._allocate_now(key, nbytes, tag))
        except BaseException:
            for a in done:
                self._drop(a.key)
            raise
        return done

    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """Write and commit several blocks with one thread hop: every data write (``queue_depth``
        in flight), then one fdatasync per slab file, then every block becomes visible at once.

        Raises InputError (lengths or buffers; every reservation of the batch is released),
        BlockNotFoundError (an unknown allocation: the batch's reservations are released; or
        one evicted while in flight: the others commit), BackendIOError (the failed blocks are
        released, the others commit), BackendClosedError. On cancellation no block of the
        batch commits: the call waits for its I/Os, durably invalidates every slot (shielded)
        and releases the reservations.
        """
        self._check_open()
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        mine: list[_Pending] = []
        views: list[memoryview] = []
        try:
            for a_in, d in zip(allocations, datas, strict=True):
                a = self._ledger.claim(a_in)  # twice in the batch: BlockNotFoundError
                mine.append(a)
                mv = as_byte_view(d)
                if len(mv) != a.nbytes:
                    raise InputError(f"[{self.name}] write of {len(mv)} bytes into a {a.nbytes}-byte allocation")
                views.append(mv)
        except BaseException:
            # nothing was written: release every reservation of the batch
            for a in mine:
                self._reject(a)
            for left in self._ledger.drop_unclaimed(allocations):
                self._release_slot(left.si, left.slot)
            raise
        if not mine:
            return
        jobs: list[tuple[int, int, int, str, bytes, memoryview]] = []
        for a, mv in zip(mine, views, strict=True):
            gen = self._take_gen()
            self._unsettled.add(gen)
            jobs.append((a.si, a.slot, gen, a.key, a.tag, mv))
        errs: list[BaseException | None]
        cancel: BaseException | None = None
        try:
            errs = await anyio.to_thread.run_sync(self._write_batch, jobs, limiter=self._limiter)
            # a cancel that arrived during the I/O is delivered here, before anything commits
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException as exc:  # cancelled (the worker, if started, has finished) or failed
            cancel = exc
            errs = [exc] * len(jobs)
        bad: list[int] = []
        first: BaseException | None = None
        for i, (a, e) in enumerate(zip(mine, errs, strict=True)):
            if e is None and self._ledger.commit(a):
                self._publish(a, jobs[i][2])  # before any await: nothing can evict it in between
                continue
            if e is None:  # evicted (or closed) while in flight
                e = BlockNotFoundError(f"reservation for {a.key!r} was dropped during write", tier=self.name)
            else:
                self._ledger.abort(a)
            bad.append(i)
            first = first or e
        if bad:
            # the data may have reached the medium: free the slots durably before they are reused
            slots = [(jobs[i][0], jobs[i][1]) for i in bad]
            with anyio.CancelScope(shield=True):
                try:
                    freed = await anyio.to_thread.run_sync(self._invalidate_batch, slots, limiter=self._limiter)
                except Exception:
                    freed = [False] * len(slots)
            for i, t, ok in zip(bad, slots, freed, strict=True):
                if ok:
                    self._settle(jobs[i][2])
                else:
                    self._poisoned.add(t)
                self._release_slot(*t)
        if cancel is not None:
            if isinstance(cancel, OSError):
                raise os_error(cancel, "write_many", tier=self.name) from cancel
            raise cancel
        if first is not None:
            if isinstance(first, OSError):
                raise os_error(first, "write_many: a write", tier=self.name) from first
            raise first

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """Read and verify several blocks with one thread hop (``queue_depth`` reads in flight).

        Raises BlockNotFoundError, InputError (before any I/O), IntegrityError (every failing
        block is quarantined; the first error is raised), BackendIOError, BackendClosedError.
        """
        self._check_open()
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        jobs: list[tuple[_Entry, str, memoryview | None]] = []
        for i, key in enumerate(keys):
            validate_key(key, tier=self.name)
            e = self._index.get(key)
            if e is None:
                raise BlockNotFoundError(f"no block {key!r}", tier=self.name)
            dst: memoryview | None = None
            if into is not None:
                dst = as_byte_view(into[i], writable=True, what="into")
                if len(dst) < e.nbytes:
                    raise InputError(f"[{self.name}] into has {len(dst)} bytes, block {key!r} has {e.nbytes}")
            jobs.append((e, key, dst))
        if not jobs:
            return []
        for e, _, _ in jobs:
            e.readers += 1
        try:
            # abandoned by a cancelled caller when every destination is this call's own
            res = await run_blocking(self._read_batch, jobs, limiter=self._limiter, abandon_on_cancel=into is None)
        finally:
            for e, _, _ in jobs:
                e.readers -= 1
                self._maybe_free(e)
        first: BaseException | None = None
        quarantine: list[tuple[str, _Entry]] = []
        seen: set[str] = set()
        for (e, key, _), r in zip(jobs, res, strict=True):
            if isinstance(r, IntegrityError):
                if self._index.get(key) is e and key not in seen:
                    seen.add(key)
                    quarantine.append((key, e))
                    first = first or r
                else:
                    first = first or BlockNotFoundError(f"block {key!r} was evicted during read", tier=self.name)
            elif isinstance(r, OSError):
                if first is None:
                    first = os_error(r, f"read of {key!r}", tier=self.name)
                    first.__cause__ = r
            elif isinstance(r, BaseException):
                first = first or r
        if quarantine:
            try:
                await self._remove_many(quarantine)
            except BackendIOError:
                pass  # the integrity error below is the one to report
        if first is not None:
            raise first
        nbytes = sum(e.nbytes for e, _, _ in jobs)
        self._counters["reads"] += len(jobs)
        self._counters["bytes_read"] += nbytes
        return list(res)

    async def evict_many(self, keys: Sequence[str]) -> list[bool]:
        """Remove several blocks durably: free headers over every slot, then one fdatasync per
        slab file, before returning. Idempotent per key; a key twice in the batch is removed
        once (True, then False). Raises InputError (before anything is removed),
        BackendClosedError, BackendIOError (slots that could not be freed are never reused)."""
        self._check_open()
        for key in keys:
            validate_key(key, tier=self.name)
        out: list[bool] = []
        victims: list[tuple[str, _Entry]] = []
        taken: set[str] = set()
        for key in keys:
            if self._drop(key):
                out.append(True)
                continue
            e = self._index.get(key)
            if e is None or key in taken:
                out.append(False)
                continue
            taken.add(key)
            victims.append((key, e))
            out.append(True)
        if victims:
            await self._remove_many(victims)
            self._counters["evictions"] += len(victims)
        return out

    async def _remove_many(self, victims: list[tuple[str, _Entry]]) -> None:
        """Hide every block at once, then free their slots durably (shielded, one fdatasync per slab)."""
        for key, e in victims:
            self._hide(key, e)
        slots = [(e.slab, e.slot) for _, e in victims]
        with anyio.CancelScope(shield=True):
            try:
                freed = await anyio.to_thread.run_sync(self._invalidate_batch, slots, limiter=self._limiter)
            except Exception:
                freed = [False] * len(slots)
        failed: list[str] = []
        for (key, e), ok in zip(victims, freed, strict=True):
            if ok:
                e.invalidated = True
                self._maybe_free(e)
            else:
                self._poisoned.add((e.slab, e.slot))
                failed.append(key)
        if failed:
            raise BackendIOError(f"evict of {len(failed)} block(s) failed, e.g. {failed[0]!r}", tier=self.name)

    async def contains(self, key: str) -> bool:
        self._check_open()
        validate_key(key, tier=self.name)
        return key in self._index

    async def scan(self) -> list[BlockInfo]:
        """Every committed block (the index rebuilt from the slot headers at open, plus later commits)."""
        self._check_open()
        return [BlockInfo(k, e.nbytes, e.tag) for k, e in self._index.items()]

    def stats(self) -> BackendStats:
        return BackendStats(
            tier=self.name,
            kind=TierKind.NVME,
            capacity_bytes=self._capacity,
            used_bytes=self._ledger.used_bytes,
            blocks=len(self._index),
            reserved_bytes=self._ledger.reserved_bytes,
            io_path=self._io_path or "O_DIRECT preadv/pwritev",
            emulated=False,
            details={
                **({"granule": self._classes[0]} if len(self._classes) == 1 else {}),
                "logical_bytes": self._ledger.logical_bytes,
                "queue_depth": self._qd,
                "slot_classes": list(self._classes),
                "slab_files": [str(s.path) for s in self._slabs],
                "free_slots": {sb: len(v) for sb, v in self._free.items()},
                "checksum": self._checksum,
                "checkpoint_gen": self._checkpoint,
                "recovered": dict(self._recovered),
                "poisoned_slots": len(self._poisoned),
            },
            **self._counters,
        )
