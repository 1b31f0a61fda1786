"""The ``rdma`` tier: a shared network pool on Mooncake Store.

Blocks are Mooncake objects written with ``batch_put_from`` and read with
``batch_get_into`` from one registered staging arena (the transfer engine
moves bytes straight from/to it: over RDMA where a device exists, over TCP
otherwise). Each object is ``header(32 B) + tag + payload``; the header holds
a magic, the format version, the checksum algorithm, the tag length, a CRC of
the full object key, the payload length and a 64-bit checksum of tag+payload.
A read verifies all of it, so a block Mooncake evicted, replaced or tore is a
miss or an :class:`~tierkv.IntegrityError`, never wrong bytes.

Keys are namespaced: ``tierkv/<namespace>/<key>``; the core passes a scope
digest as ``namespace`` so models and tenants never collide in a shared pool.

Contract notes (see :mod:`tierkv.backend` for the shared contract):

* Every blocking client call runs in a worker thread (``anyio.to_thread``,
  limiter of ``max_concurrency``) under a deadline of ``timeout`` seconds; a
  call that does not return in time (master or peer gone) raises
  :class:`~tierkv.BackendIOError` and the worker thread is abandoned; the
  staging memory it holds is released by the thread itself when it returns, and
  a put that completes after its caller gave up is removed again.
* Accounting (``used_bytes``, ``blocks``) is this client's view of the blocks
  *it* committed; the pool is shared, so other processes' blocks are readable
  (``read``/``contains``) but not counted. A committed block that Mooncake
  dropped on its own (pressure eviction, master restart, peer loss) is reported
  as :class:`~tierkv.BlockNotFoundError` and counted in
  ``stats().details["evicted_remotely"]``.
* ``evict`` removes with ``remove(force=False)`` first; an object under a read
  lease (``OBJECT_HAS_LEASE``, -706) is then removed with ``force=True``
  (``force_evict``, default) or retried until ``timeout``.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import re
import socket
import statistics
import struct
import threading
import time
import types
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import numpy as np

from tierkv.backend import (
    MAX_TAG_BYTES,
    Allocation,
    Availability,
    Backend,
    BackendStats,
    Buffer,
    Capabilities,
    RawMeasurement,
    Reservation,
    ReservationLedger,
    TierKind,
    as_byte_view,
    certify_batch,
    opt_bool,
    opt_choice,
    opt_float,
    opt_int,
    opt_size,
    opt_str,
    reject_unknown,
    validate_key,
)
from tierkv.errors import (
    BackendError,
    BackendIOError,
    BlockNotFoundError,
    ConfigError,
    InputError,
    IntegrityError,
    PluginUnavailableError,
)

from ._mooncake import MasterProcess, MasterStartError, code_name, translate

__all__ = ["HEADER_BYTES", "RdmaBackend"]

T = TypeVar("T")

#: Bytes of the per-object header.
HEADER_BYTES = 32
_HEADER = struct.Struct("<4sBBHIQQ4x")
_MAGIC = b"TKVR"
_VERSION = 1
_ALGO_XXH3 = 1
_ALGO_CRC32 = 2
_ALGO_NAMES = {"xxh3": _ALGO_XXH3, "crc32": _ALGO_CRC32}
_ALGO_LABEL = {v: k for k, v in _ALGO_NAMES.items()}
_ALIGN = 64
#: Scratch for one object's header + tag (the largest tag fits), 64-byte aligned.
_HDR_SLOT = (HEADER_BYTES + MAX_TAG_BYTES + _ALIGN - 1) // _ALIGN * _ALIGN
#: Header slots per set-aside chunk; a batch with more objects takes its header room from the arena.
_HDR_PER_CHUNK = 512
_HDR_CHUNK = _HDR_PER_CHUNK * _HDR_SLOT
_NS_RE = re.compile(r"[0-9A-Za-z._-]{1,128}")
_NOT_FOUND = (-703, -704, -707, -710, -712)
_INSTALL_HINT = "pip install 'tierkv[rdma]' (mooncake-transfer-engine-non-cuda; apt install libibverbs1)"

_KNOWN = frozenset(
    {
        "master",
        "start_master",
        "master_log_dir",
        "metadata",
        "metadata_server",
        "local_hostname",
        "global_segment_size",
        "local_buffer_size",
        "staging_bytes",
        "capacity",
        "protocol",
        "devices",
        "namespace",
        "max_concurrency",
        "timeout",
        "force_evict",
        "checksum",
        "lease_ttl_ms",
    }
)


# ------------------------------------------------------------------ checksum
def _xxh3_module() -> Any:
    """The ``xxhash`` module, or None when it is not installed (looked up once: this is on
    every block's path, and an ``import`` statement per call costs more than the lookup)."""
    global _XXHASH
    if _XXHASH is False:
        try:
            import xxhash
        except ImportError:
            _XXHASH = None
        else:
            _XXHASH = xxhash
    return _XXHASH


_XXHASH: Any = False  # not looked up yet


def _checksum(algo: int, region: memoryview | bytes) -> int:
    if algo == _ALGO_XXH3:
        return int(_xxh3_module().xxh3_64_intdigest(region))
    return zlib.crc32(region)


def _checksum_parts(algo: int, parts: Sequence[memoryview | bytes]) -> int:
    """The checksum of the concatenation of ``parts`` without concatenating them
    (one-shot when at most one part is non-empty: same value, less work)."""
    nonempty = [p for p in parts if len(p)]
    if len(nonempty) <= 1:
        return _checksum(algo, nonempty[0] if nonempty else b"")
    if algo == _ALGO_XXH3:
        h = _xxh3_module().xxh3_64()
        for p in nonempty:
            h.update(p)
        return int(h.intdigest())
    crc = 0
    for p in nonempty:
        crc = zlib.crc32(p, crc)
    return crc


def _address(mv: memoryview) -> int:
    """Address of a contiguous byte view (read-only views too)."""
    if not len(mv):
        return 0
    if not mv.readonly:  # ctypes is ~7x cheaper than numpy here; it needs a writable buffer
        return ctypes.addressof(ctypes.c_char.from_buffer(mv))
    return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data)


def _xxhash_available() -> bool:
    return _xxh3_module() is not None


# --------------------------------------------------------------- staging arena
class _Staging:
    """A page-aligned anonymous mapping registered with Mooncake, carved first-fit.

    Thread-safe: worker threads allocate (all slots of a batch at once, so no
    holder ever waits while holding) and free; waiting is bounded by a deadline.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.view = memoryview(self._map)
        self.ptr = int(self.array.ctypes.data)
        self._free: list[tuple[int, int]] = [(0, size)]
        self._cv = threading.Condition()
        self._hdr_chunks: list[int] = []

    @staticmethod
    def _round(n: int) -> int:
        return max(_ALIGN, (n + _ALIGN - 1) // _ALIGN * _ALIGN)

    def _try(self, sizes: Sequence[int]) -> list[int] | None:
        free = list(self._free)
        offs: list[int] = []
        for n in sizes:
            need = self._round(n)
            for i, (off, ln) in enumerate(free):
                if ln >= need:
                    offs.append(off)
                    free[i] = (off + need, ln - need)
                    break
            else:
                return None
        self._free = [f for f in free if f[1] > 0]
        return offs

    def carve_header_chunks(self, n: int) -> None:
        """Set aside ``n`` chunks of :data:`_HDR_PER_CHUNK` header slots (one per batch in
        flight), taken and given back by :meth:`take_headers` / :meth:`give_headers`
        without the arena's lock (``list.pop`` / ``append`` are atomic). At most an
        eighth of the arena; with none set aside every batch takes arena space."""
        n = min(n, self.size // 8 // _HDR_CHUNK)
        if n <= 0:
            return
        [off] = self.alloc_many([n * _HDR_CHUNK], time.monotonic())
        self._hdr_chunks = [off + i * _HDR_CHUNK for i in range(n)]

    def take_headers(self, count: int, deadline: float) -> tuple[int, bool]:
        """Room for ``count`` header slots of :data:`_HDR_SLOT` bytes: (offset, pooled).
        A set-aside chunk when one is free and large enough, else arena space
        (waiting up to ``deadline``, TimeoutError)."""
        if count <= _HDR_PER_CHUNK:
            try:
                return self._hdr_chunks.pop(), True
            except IndexError:
                pass
        return self.alloc_many([count * _HDR_SLOT], deadline)[0], False

    def give_headers(self, off: int, count: int, pooled: bool) -> None:
        if pooled:
            self._hdr_chunks.append(off)
        else:
            self.free_many([off], [count * _HDR_SLOT])

    def alloc_many(self, sizes: Sequence[int], deadline: float) -> list[int]:
        with self._cv:
            while True:
                offs = self._try(sizes)
                if offs is not None:
                    return offs
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("staging arena exhausted")
                self._cv.wait(min(left, 0.5))

    def free_many(self, offs: Sequence[int], sizes: Sequence[int]) -> None:
        with self._cv:
            spans = sorted([*self._free, *((o, self._round(n)) for o, n in zip(offs, sizes, strict=True))])
            merged: list[tuple[int, int]] = []
            for off, ln in spans:
                if merged and merged[-1][0] + merged[-1][1] == off:
                    merged[-1] = (merged[-1][0], merged[-1][1] + ln)
                else:
                    merged.append((off, ln))
            self._free = merged
            self._cv.notify_all()

    def close(self) -> None:
        self.view.release()
        del self.array
        with contextlib.suppress(BufferError):
            self._map.close()


#: Masters started by ``start_master`` in this process: identity -> (master, users).
_MASTERS: dict[tuple[str, str, int], tuple[MasterProcess, int]] = {}
_MASTERS_LOCK = threading.Lock()


def _release_master(master: MasterProcess) -> None:
    """Drop one user of a shared private master; the last one stops it."""
    with _MASTERS_LOCK:
        for ident, (m, users) in list(_MASTERS.items()):
            if m is master:
                if users > 1:
                    _MASTERS[ident] = (m, users - 1)
                    return
                del _MASTERS[ident]
                break
    master.stop()


class _Skipped(RuntimeError):
    """A worker call skipped because its caller was cancelled or timed out first."""


@dataclass(frozen=True, slots=True)
class _Got:
    """Outcome of reading one object in a worker thread."""

    code: int = 0  # 0 ok, negative Mooncake code
    data: memoryview | None = None
    integrity: str = ""  # non-empty: verification failed (object quarantined)
    too_small: int = -1  # >= 0: ``into`` was too small for a block of this size


def _chunks(sizes: Sequence[int], budget: int) -> list[range]:
    out: list[range] = []
    start = 0
    total = 0
    for i, n in enumerate(sizes):
        if i > start and total + n > budget:
            out.append(range(start, i))
            start, total = i, 0
        total += n
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out


class RdmaBackend(Backend):
    """Tier backend on Mooncake Store (see the module docstring).

    Options (all optional with ``start_master``):
        master: ``"host:port"`` of ``mooncake_master``.
        start_master: start a private master on 127.0.0.1 (free ports) for the
            backend's lifetime (``tierkv certify rdma`` uses this); backends of
            one process opened with the same ``master_log_dir`` share it (one
            pool), and the last one closed stops it.
        master_log_dir: where that master's log goes (kept if it fails).
        metadata: ``"p2p"`` (Mooncake's P2PHANDSHAKE, default) or ``"http"``.
        metadata_server: HTTP metadata URL (``metadata="http"`` without
            ``start_master``).
        local_hostname: this client's address for the transfer engine (127.0.0.1).
        global_segment_size: memory this client contributes to the pool (512MiB).
        local_buffer_size: Mooncake's own client buffer (16MiB).
        staging_bytes: the registered staging arena (64MiB); caps
            ``max_block_bytes`` and the bytes in flight.
        capacity: the bytes this client may reserve (half of global_segment_size).
        protocol: ``"auto"`` (rdma when a device is found, else tcp), ``"rdma"``, ``"tcp"``.
        devices: ``"auto"`` or a comma-separated list of RDMA device names.
        namespace: key prefix isolating models and tenants (``"default"``).
        max_concurrency: worker threads (4).
        timeout: seconds bounding every client call (30).
        force_evict: force-remove objects under a read lease (true).
        checksum: ``"xxh3"`` (default when xxhash is installed) or ``"crc32"``.
        lease_ttl_ms: lease TTL for a master started by ``start_master`` (10000).
    """

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(options, name=name or "rdma")
        o = self.options
        reject_unknown(o, _KNOWN)
        self._start_master = opt_bool(o, "start_master", False)
        self._master_addr = "" if self._start_master else opt_str(o, "master", None)
        if self._start_master and "master" in o:
            raise ConfigError("master", o["master"], "not set together with start_master=true")
        self._master_log_dir = Path(opt_str(o, "master_log_dir", "/tmp/tierkv-mooncake"))
        self._metadata = opt_choice(o, "metadata", ("p2p", "http"), "p2p")
        self._metadata_server = ""
        if self._metadata == "http" and not self._start_master:
            self._metadata_server = opt_str(o, "metadata_server", None)
        self._local_hostname = opt_str(o, "local_hostname", "127.0.0.1")
        self._segment = opt_size(o, "global_segment_size", "512MiB", minimum=1 << 20)
        self._local_buffer = opt_size(o, "local_buffer_size", "16MiB", minimum=1 << 20)
        self._staging_bytes = opt_size(o, "staging_bytes", "64MiB", minimum=1 << 20, maximum=1 << 40)
        self._capacity = opt_size(o, "capacity", self._segment // 2)
        self._protocol_opt = opt_choice(o, "protocol", ("auto", "rdma", "tcp"), "auto")
        self._devices_opt = opt_str(o, "devices", "auto")
        self._namespace = opt_str(o, "namespace", "default")
        if not _NS_RE.fullmatch(self._namespace):
            raise ConfigError("namespace", self._namespace, "1-128 characters from [0-9A-Za-z._-]")
        self._max_conc = opt_int(o, "max_concurrency", 4, minimum=1, maximum=256)
        self._timeout = opt_float(o, "timeout", 30.0, minimum=0.1, maximum=3600.0)
        self._force_evict = opt_bool(o, "force_evict", True)
        default_ck = "xxh3" if _xxhash_available() else "crc32"
        self._algo = _ALGO_NAMES[opt_choice(o, "checksum", ("xxh3", "crc32"), default_ck)]
        if self._algo == _ALGO_XXH3 and not _xxhash_available():
            raise ConfigError("checksum", "xxh3", "'crc32' (xxh3 needs the xxhash package)")
        self._lease_ttl = opt_int(o, "lease_ttl_ms", 10_000, minimum=100)
        self._max_block = self._staging_bytes // 2 - HEADER_BYTES - MAX_TAG_BYTES - _ALIGN

        self._limiter = anyio.CapacityLimiter(self._max_conc)
        self._store: Any = None
        self._staging: _Staging | None = None
        self._master: MasterProcess | None = None
        self._protocol = "tcp"
        self._direct = False  # TCP: payloads move straight from/to the caller's buffers
        self._devices: list[str] = []
        self._discovery: dict[str, Any] = {}
        self._committed: dict[str, tuple[int, int]] = {}  # key -> (nbytes, tag length)
        # this client's reservations and budget (``capacity``), committed blocks included
        self._ledger: ReservationLedger[Reservation] = ReservationLedger(
            tier=self.name, capacity=self._capacity, max_block_bytes=self._max_block
        )
        self._raw_runs = itertools.count(1)
        self._raw_threads: dict[tuple[str, int, int, int, int], int] = {}  # raw_reference's choice
        self._c = {
            "reads": 0,
            "writes": 0,
            "evictions": 0,
            "bytes_read": 0,
            "bytes_written": 0,
            "evicted_remotely": 0,
            "integrity_failures": 0,
            "lease_conflicts": 0,
            "timeouts": 0,
            "misses": 0,
        }

    # ---------------------------------------------------------------- declaration
    @classmethod
    def probe(cls) -> Availability:
        try:
            import mooncake.store  # noqa: F401
        except ImportError as exc:
            return Availability(False, f"Mooncake Store is not importable: {exc}", _INSTALL_HINT)
        from ._mooncake import find_master_binary

        if find_master_binary() is None:
            return Availability(True, "mooncake_master not found: only an external master can be used")
        return Availability(True)

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        avail = cls.probe()
        if not avail.usable:
            raise PluginUnavailableError(avail.reason, group="tierkv.backends", name="rdma", hint=avail.hint)
        return {
            "start_master": True,
            "master_log_dir": str(workdir / "mooncake"),
            "global_segment_size": "1GiB",
            "capacity": "256MiB",
            "staging_bytes": "128MiB",
            "protocol": "auto",
        }

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            tier_kind=TierKind.RDMA,
            persistent=False,
            shared=True,
            alignment=1,
            max_block_bytes=self._max_block,
            max_concurrency=self._max_conc,
        )

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def master_address(self) -> str:
        """The master this backend talks to (known after ``open``)."""
        return self._master_addr

    # ------------------------------------------------------------------ lifecycle
    async def _open(self) -> None:
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as exc:
            raise PluginUnavailableError(
                f"Mooncake Store is not importable: {exc}", group="tierkv.backends", name="rdma", hint=_INSTALL_HINT
            ) from exc
        from ._verbs import choose_devices, discover

        found = await anyio.to_thread.run_sync(discover)
        self._discovery = found.as_dict()
        if self._devices_opt == "auto":
            self._devices = choose_devices(found.devices)
        else:
            self._devices = [d.strip() for d in self._devices_opt.split(",") if d.strip()]
        if self._protocol_opt == "auto":
            self._protocol = "rdma" if self._devices else "tcp"
        else:
            self._protocol = self._protocol_opt
        if self._protocol == "rdma" and not self._devices:
            raise PluginUnavailableError(
                f"protocol 'rdma' requested but {found.summary()}",
                group="tierkv.backends",
                name="rdma",
                hint="use protocol='tcp' (emulation) or 'auto' on a machine without RDMA",
            )
        try:
            if self._start_master:
                self._master = await anyio.to_thread.run_sync(self._acquire_master)
                self._master_addr = self._master.address
                if self._metadata == "http":
                    self._metadata_server = self._master.metadata_url
            else:
                # setup() holds the GIL and retries an unreachable master for ~90 s, ignoring
                # our deadline: refuse a master that does not even accept a connection first.
                await self._run(self._probe_master, what="connect to the master")
            self._direct = self._protocol == "tcp"
            store = MooncakeDistributedStore()
            meta = "P2PHANDSHAKE" if self._metadata == "p2p" else self._metadata_server
            args = (
                self._local_hostname,
                meta,
                self._segment,
                self._local_buffer,
                self._protocol,
                ",".join(self._devices),
                self._master_addr,
            )
            rc = await self._run(lambda: int(store.setup(*args)), what="setup")
            if rc != 0:
                raise BackendIOError(
                    f"mooncake setup against master {self._master_addr} failed: {code_name(rc)}", tier=self.name
                )
            self._store = store
            staging = _Staging(self._staging_bytes)
            rc = await self._run(lambda: int(store.register_buffer(staging.ptr, staging.size)), what="register_buffer")
            if rc != 0:
                staging.close()
                raise BackendIOError(f"register_buffer failed: {code_name(rc)}", tier=self.name)
            staging.carve_header_chunks(2 * self._max_conc)
            self._staging = staging
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._teardown()
            raise

    async def _teardown(self) -> None:
        store, staging, master = self._store, self._staging, self._master
        self._store = self._staging = self._master = None

        def work() -> None:
            if store is not None:
                if staging is not None:
                    with contextlib.suppress(Exception):
                        store.unregister_buffer(staging.ptr)
                with contextlib.suppress(Exception):
                    store.close()
            if staging is not None:
                staging.close()
            if master is not None:
                _release_master(master)

        with anyio.move_on_after(self._timeout + 10):
            await anyio.to_thread.run_sync(work, abandon_on_cancel=True)

    async def _close(self) -> None:
        self._ledger.clear()
        with anyio.CancelScope(shield=True):
            await self._teardown()

    # -------------------------------------------------------------------- helpers
    def _acquire_master(self) -> MasterProcess:
        """Start the private master, or share the one this process already runs for
        the same ``master_log_dir`` and settings (so that two backends opened with
        the same ``start_master`` options see one pool). Raises BackendIOError."""
        ident = (str(self._master_log_dir.resolve()), self._metadata, self._lease_ttl)
        with _MASTERS_LOCK:
            held = _MASTERS.get(ident)
            if held is not None and held[0].alive():
                _MASTERS[ident] = (held[0], held[1] + 1)
                return held[0]
            m = MasterProcess(
                log_dir=self._master_log_dir, http_metadata=self._metadata == "http", lease_ttl_ms=self._lease_ttl
            )
            try:
                m.start()
            except MasterStartError as exc:
                raise BackendIOError(f"could not start mooncake_master: {exc}", tier=self.name) from exc
            _MASTERS[ident] = (m, 1)
            return m

    def _probe_master(self) -> None:
        host, _, port = self._master_addr.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=min(self._timeout, 5.0)):
                pass
        except (OSError, ValueError) as exc:
            raise BackendIOError(
                f"mooncake master {self._master_addr} is not reachable: {exc}", tier=self.name
            ) from exc

    def _skey(self, key: str) -> str:
        return f"tierkv/{self._namespace}/{key}"

    async def _run(self, fn: Callable[[], T], *, what: str) -> T:
        """Run ``fn`` in a worker thread, bounded by ``timeout`` (-> BackendIOError).

        Cancelled by the caller: a call not yet started never starts; a call
        already running is waited for (shielded, at most ``timeout``) so that no
        put or remove lands after the cancelled operation returned.
        """
        # Who runs first decides: the worker claims the call (and holds ``busy`` while it
        # runs), or the caller gave up before it started and the call never starts.
        # ``dict.setdefault`` with a str key is atomic under the GIL; no Event or
        # Condition per call (this is on every batch's path).
        claim: dict[str, str] = {}
        busy = threading.Lock()

        def call() -> T:
            with busy:
                if claim.setdefault("by", "worker") != "worker":
                    raise _Skipped(what)
                return fn()

        try:
            with anyio.fail_after(self._timeout):
                return await anyio.to_thread.run_sync(call, limiter=self._limiter, abandon_on_cancel=True)
        except TimeoutError as exc:
            claim.setdefault("by", "caller")
            raise self._timed_out(what) from exc
        except anyio.get_cancelled_exc_class():
            if claim.setdefault("by", "caller") == "worker":  # already running: let it finish first
                with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
                    await anyio.to_thread.run_sync(self._wait_released, busy, self._timeout, abandon_on_cancel=True)
            raise

    def _timed_out(self, what: str) -> BackendIOError:
        self._c["timeouts"] += 1
        return BackendIOError(
            f"mooncake {what} did not finish within {self._timeout:g}s (master or peer unresponsive)",
            tier=self.name,
        )

    @staticmethod
    def _wait_released(lock: threading.Lock, timeout: float) -> None:
        if lock.acquire(timeout=timeout):
            lock.release()

    def _lost(self, key: str) -> None:
        """A block this client committed is gone from the pool (not by our evict)."""
        entry = self._committed.pop(key, None)
        if entry is not None:
            self._ledger.release(entry[0])
            self._c["evicted_remotely"] += 1

    # ----------------------------------------------------------------------- data
    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        """Reserve ``nbytes`` under ``key`` in this client's budget (see the class doc)."""
        self._check_open()
        return self._ledger.reserve(key, nbytes, tag, committed=self._committed)

    async def allocate_many(self, items: Sequence[tuple[str, int, bytes]]) -> list[Allocation]:
        """Reserve several blocks, all or nothing (local bookkeeping only: no round trip)."""
        self._check_open()
        return self._ledger.reserve_many(items, committed=self._committed)

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        """Put the block (one ``batch_put_from``); see :meth:`Backend.write`."""
        await self.write_many([allocation], [data])

    def _put_work(
        self, items: list[tuple[str, bytes, memoryview]], deadline: float, abandoned: threading.Event
    ) -> list[int]:
        """Worker thread: header (+tag) and checksum, then one put per chunk.

        Over TCP the payload goes straight from the caller's buffer
        (``batch_put_from_multi_buffers``: header+tag from the registered arena,
        payload in place; the checksum is computed over the caller's bytes, no
        copy). Over RDMA the whole object is staged in the registered arena
        (the NIC can only read registered memory) and put with ``batch_put_from``.
        """
        staging, store = self._staging, self._store
        if staging is None or store is None:
            return [-1] * len(items)
        direct = self._direct
        heads = [HEADER_BYTES + len(tag) for _, tag, _ in items]
        sizes = [h + len(mv) for h, (_, _, mv) in zip(heads, items, strict=True)]
        staged = [_HDR_SLOT] * len(items) if direct else sizes
        codes: list[int] = []
        for chunk in _chunks(staged, staging.size // 4 if direct else staging.size // 2):
            csizes = [staged[i] for i in chunk]
            if direct:  # header slots only: the payloads stay where they are
                hbase, pooled = staging.take_headers(len(chunk), deadline)
                offs = [hbase + j * _HDR_SLOT for j in range(len(chunk))]
            else:
                offs = staging.alloc_many(csizes, deadline)
            try:
                keys: list[str] = []
                view = staging.view
                for off, i in zip(offs, chunk, strict=True):
                    skey, tag, mv = items[i]
                    t0 = off + HEADER_BYTES
                    view[t0 : t0 + len(tag)] = tag
                    if direct:
                        ck = _checksum_parts(self._algo, (tag, mv))
                    else:
                        view[t0 + len(tag) : t0 + len(tag) + len(mv)] = mv
                        ck = _checksum(self._algo, view[t0 : t0 + len(tag) + len(mv)])
                    key_crc = zlib.crc32(skey.encode())
                    _HEADER.pack_into(view, off, _MAGIC, _VERSION, self._algo, len(tag), key_crc, len(mv), ck)
                    keys.append(skey)
                if direct:
                    ptrs: list[list[int]] = []
                    lens: list[list[int]] = []
                    for off, i in zip(offs, chunk, strict=True):
                        mv = items[i][2]
                        ptrs.append([staging.ptr + off] + ([_address(mv)] if len(mv) else []))
                        lens.append([heads[i]] + ([len(mv)] if len(mv) else []))
                    raw = store.batch_put_from_multi_buffers(keys, ptrs, lens)
                else:
                    raw = store.batch_put_from(keys, [staging.ptr + o for o in offs], csizes)
                res = [int(c) for c in raw]
                if abandoned.is_set():
                    for k, c in zip(keys, res, strict=True):
                        if c == 0:
                            store.remove(k, True)
                codes.extend(res)
            finally:
                if direct:
                    staging.give_headers(hbase, len(chunk), pooled)
                else:
                    staging.free_many(offs, csizes)
        return codes

    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """Put all blocks with ``batch_put_from`` (chunked by the staging arena).

        Each block commits independently; blocks that fail release their
        reservation and the first error is raised after all were tried.
        """
        self._check_open()
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        allocs: list[Reservation] = []
        views: list[memoryview] = []
        try:
            for allocation in allocations:
                allocs.append(self._ledger.claim(allocation))
            for a, d in zip(allocs, datas, strict=True):
                mv = as_byte_view(d)
                if len(mv) != a.nbytes:
                    raise InputError(f"[{self.name}] write of {len(mv)} bytes into a {a.nbytes}-byte allocation")
                views.append(mv)
        except BaseException:
            for a in allocs:
                self._ledger.abort(a)
            raise
        items = [(self._skey(a.key), a.tag, mv) for a, mv in zip(allocs, views, strict=True)]
        abandoned = threading.Event()
        deadline = time.monotonic() + self._timeout
        try:
            codes = await self._run(partial(self._put_work, items, deadline, abandoned), what="batch_put_from")
        except BaseException:
            abandoned.set()
            for a in allocs:
                self._ledger.abort(a)
            with anyio.CancelScope(shield=True):
                await self._remove_quietly([k for k, _, _ in items])
            raise
        first: BackendError | None = None
        gone: list[str] = []
        for a, code in zip(allocs, codes, strict=True):
            if code == 0 and self._ledger.commit(a):
                self._committed[a.key] = (a.nbytes, len(a.tag))
                self._c["writes"] += 1
                self._c["bytes_written"] += a.nbytes
                continue
            self._ledger.abort(a)
            if code == 0:  # evicted or closed while in flight: nothing stays visible
                gone.append(self._skey(a.key))
                err: BackendError = BlockNotFoundError(
                    f"reservation for {a.key!r} was dropped during write", tier=self.name
                )
            else:
                err = translate(code, op="put", key=a.key, tier=self.name)
            first = first or err
        if gone:
            with anyio.CancelScope(shield=True):
                await self._remove_quietly(gone)
        if first is not None:
            raise first

    async def _remove_quietly(self, skeys: list[str]) -> None:
        store = self._store
        if store is None or not skeys:
            return

        def work() -> None:
            with contextlib.suppress(Exception):
                store.batch_remove(skeys, True)

        with anyio.move_on_after(self._timeout):
            await anyio.to_thread.run_sync(work, abandon_on_cancel=True)

    def _verify(
        self, skey: str, region: memoryview, got: int, payload: memoryview | None = None
    ) -> tuple[str, int, int]:
        """(problem, tag length, nbytes) for an object of ``got`` bytes.

        ``region`` holds the whole object, or only header+tag when the payload
        was scattered into ``payload`` (then ``region`` must be exactly
        header+tag long: a header announcing another tag length is a problem).
        """
        if got < HEADER_BYTES or len(region) < HEADER_BYTES:
            return f"object of {got} bytes is shorter than the header", 0, 0
        magic, version, algo, tlen, key_crc, nbytes, ck = _HEADER.unpack_from(region, 0)
        if magic != _MAGIC or version != _VERSION or algo not in _ALGO_LABEL:
            return "bad header (not a tierkv object or unknown version)", 0, 0
        if key_crc != zlib.crc32(skey.encode()):
            return "header names another key", 0, 0
        if HEADER_BYTES + tlen + nbytes != got:
            return f"length mismatch: header says {HEADER_BYTES + tlen + nbytes} bytes, object has {got}", 0, 0
        if payload is not None and (HEADER_BYTES + tlen != len(region) or len(payload) != nbytes):
            return "layout mismatch", 0, 0
        if algo == _ALGO_XXH3 and not _xxhash_available():
            return "object checksummed with xxh3 but xxhash is not installed", 0, 0
        if payload is None:
            actual = _checksum(algo, region[HEADER_BYTES:got])
        else:
            actual = _checksum_parts(algo, (region[HEADER_BYTES:], payload))
        if actual != ck:
            return "checksum mismatch", 0, 0
        return "", tlen, nbytes

    def _get_direct(
        self, items: list[tuple[str, int, memoryview | None, int]], idx: list[int], deadline: float
    ) -> tuple[dict[int, _Got], list[int], list[str]]:
        """TCP fast path: header+tag into the arena, payload straight into ``into``
        (``batch_get_into_multi_buffers``), verified in place. Returns the
        outcomes, the items to redo through the staging path (size or layout
        changed) and the keys to quarantine.

        Objects are verified in the reverse of the order Mooncake copied them:
        the last one copied is the most likely to still be in the CPU caches, and
        hashing oldest-first would make every miss evict the next object to hash."""
        staging, store = self._staging, self._store
        assert staging is not None and store is not None
        out: dict[int, _Got] = {}
        redo: list[int] = []
        quarantine: list[str] = []
        heads = [items[i][3] for i in idx]
        hbase, pooled = staging.take_headers(len(idx), deadline)
        offs = [hbase + j * _HDR_SLOT for j in range(len(idx))]
        try:
            base = staging.ptr
            ptrs: list[list[int]] = []
            lens: list[list[int]] = []
            keys: list[str] = []
            for i, off, h in zip(idx, offs, heads, strict=True):
                skey, size, into, _ = items[i]
                assert into is not None
                n = size - h
                keys.append(skey)
                if n:
                    ptrs.append([base + off, _address(into[:n])])
                    lens.append([h, n])
                else:
                    ptrs.append([base + off])
                    lens.append([h])
            res = [int(r) for r in store.batch_get_into_multi_buffers(keys, ptrs, lens)]
            view = staging.view
            for j in range(len(idx) - 1, -1, -1):
                i, off, h, r = idx[j], offs[j], heads[j], res[j]
                skey, size, into, _ = items[i]
                assert into is not None
                if r in _NOT_FOUND:
                    out[i] = _Got(code=r)
                    continue
                if r != size:  # another size than we wrote (replaced) or a transfer error: redo staged
                    redo.append(i)
                    continue
                payload = into[: size - h]
                problem = self._verify(skey, view[off : off + h], r, payload)[0]
                if problem == "layout mismatch":
                    redo.append(i)
                elif problem:
                    quarantine.append(skey)
                    out[i] = _Got(integrity=problem)
                else:
                    out[i] = _Got(data=payload)
        finally:
            staging.give_headers(hbase, len(idx), pooled)
        redo.reverse()
        return out, redo, quarantine

    def _get_work(self, items: list[tuple[str, int, memoryview | None, int]], deadline: float) -> list[_Got]:
        """Worker thread: one batch get per chunk, verify, hand out.

        Over TCP, blocks whose size this client knows (it wrote them) and that
        have an ``into`` go through :meth:`_get_direct` (no staging copy);
        everything else is sized (``get_size``), read into the registered arena
        with ``batch_get_into``, verified and copied out.
        """
        staging, store = self._staging, self._store
        if staging is None or store is None:
            return [_Got(code=-1)] * len(items)
        out: list[_Got | None] = [None] * len(items)
        quarantine: list[str] = []
        rest = list(range(len(items)))
        if self._direct:
            fast = [
                i
                for i, (_, size, into, head) in enumerate(items)
                if head > 0 and into is not None and len(into) >= size - head
            ]
            step = max(_HDR_PER_CHUNK, staging.size // 4 // _HDR_SLOT)
            redo: list[int] = []
            for lo in range(0, len(fast), step):
                got, again, bad = self._get_direct(items, fast[lo : lo + step], deadline)
                for i, g in got.items():
                    out[i] = g
                quarantine += bad
                redo += again
            if fast:
                fastset = set(fast) - set(redo)
                rest = [i for i in rest if i not in fastset]
                for i in redo:
                    skey, _, into, _ = items[i]
                    items[i] = (skey, 0, into, 0)
        sizes: list[int] = []
        todo: list[int] = []
        for i in rest:
            skey, size, _, _ = items[i]
            if size <= 0:
                size = int(store.get_size(skey))
                if size < 0:
                    out[i] = _Got(code=size)
                    continue
                if size > staging.size // 2:
                    out[i] = _Got(integrity=f"object of {size} bytes exceeds the staging arena")
                    continue
            todo.append(i)
            sizes.append(size)
        for chunk in _chunks(sizes, staging.size // 2):
            idx = [todo[j] for j in chunk]
            csizes = [sizes[j] for j in chunk]
            offs = staging.alloc_many(csizes, deadline)
            try:
                keys = [items[i][0] for i in idx]
                res = [int(r) for r in store.batch_get_into(keys, [staging.ptr + o for o in offs], csizes)]
                for i, off, n, r in zip(idx, offs, csizes, res, strict=True):
                    skey, _, into, _ = items[i]
                    if r == -600:  # the stored object is larger than expected: re-read with its real size
                        real = int(store.get_size(skey))
                        if 0 < real <= staging.size // 2 and real != n:
                            out[i] = self._get_work([(skey, real, into, 0)], deadline)[0]
                            continue
                    if r < 0:
                        out[i] = _Got(code=r)
                        continue
                    region = staging.view[off : off + r]
                    problem, tlen, nbytes = self._verify(skey, region, r)
                    if problem:
                        quarantine.append(skey)
                        out[i] = _Got(integrity=problem)
                        continue
                    payload = region[HEADER_BYTES + tlen : HEADER_BYTES + tlen + nbytes]
                    if into is not None:
                        if len(into) < nbytes:
                            out[i] = _Got(too_small=nbytes)
                            continue
                        into[:nbytes] = payload
                        out[i] = _Got(data=into[:nbytes])
                    else:
                        out[i] = _Got(data=memoryview(bytearray(payload)))
            finally:
                staging.free_many(offs, csizes)
        for skey in quarantine:
            with contextlib.suppress(Exception):
                store.remove(skey, True)
        return [g if g is not None else _Got(code=-1) for g in out]

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        """Get the block (one ``batch_get_into``); see :meth:`Backend.read`."""
        return (await self.read_many([key], into=None if into is None else [into]))[0]

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """Get all blocks with ``batch_get_into``; the first failure raises
        (BlockNotFoundError, IntegrityError, InputError, BackendIOError)."""
        self._check_open()
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        items: list[tuple[str, int, memoryview | None, int]] = []
        for i, k in enumerate(keys):
            validate_key(k, tier=self.name)
            dst = None if into is None else as_byte_view(into[i], writable=True, what="into")
            entry = self._committed.get(k)
            size = HEADER_BYTES + entry[1] + entry[0] if entry else 0
            if entry and dst is not None and len(dst) < entry[0]:
                raise InputError(f"[{self.name}] into holds {len(dst)} bytes, block {k!r} has {entry[0]}")
            items.append((self._skey(k), size, dst, HEADER_BYTES + entry[1] if entry else 0))
        deadline = time.monotonic() + self._timeout
        got = await self._run(partial(self._get_work, items, deadline), what="batch_get_into")
        first: BaseException | None = None
        views: list[memoryview] = []
        for k, g in zip(keys, got, strict=True):
            if g.data is not None:
                self._c["reads"] += 1
                self._c["bytes_read"] += len(g.data)
                views.append(g.data)
                continue
            err: BaseException
            if g.integrity:
                self._c["integrity_failures"] += 1
                entry = self._committed.pop(k, None)
                if entry is not None:
                    self._ledger.release(entry[0])
                err = IntegrityError(f"block {k!r} failed verification ({g.integrity}); quarantined", tier=self.name)
            elif g.too_small >= 0:
                err = InputError(f"[{self.name}] into is too small for block {k!r} of {g.too_small} bytes")
            elif g.code in _NOT_FOUND:
                self._c["misses"] += 1
                self._lost(k)
                err = BlockNotFoundError(f"no block {k!r} ({code_name(g.code)})", tier=self.name)
            else:
                err = translate(g.code, op="get", key=k, tier=self.name)
            first = first or err
        if first is not None:
            raise first
        return views

    async def evict(self, key: str) -> bool:
        """Remove the block or reservation; -706 (read lease) -> forced remove or retry."""
        return (await self.evict_many([key]))[0]

    def _remove_work(self, skeys: list[str], deadline: float) -> tuple[list[int], int]:
        store = self._store
        if store is None:
            return [-1] * len(skeys), 0
        codes = [int(c) for c in store.batch_remove(skeys, False)]
        conflicts = 0
        while True:
            leased = [i for i, c in enumerate(codes) if c == -706]
            if not leased:
                return codes, conflicts
            conflicts += len(leased)
            force = self._force_evict or time.monotonic() >= deadline
            if not force:
                time.sleep(0.1)
            again = [int(c) for c in store.batch_remove([skeys[i] for i in leased], force)]
            for i, c in zip(leased, again, strict=True):
                codes[i] = c
            if force:
                return codes, conflicts

    async def evict_many(self, keys: Sequence[str]) -> list[bool]:
        """Evict several keys with one ``batch_remove``; idempotent."""
        self._check_open()
        for k in keys:
            validate_key(k, tier=self.name)
        result = [False] * len(keys)
        remote: list[int] = []
        for i, k in enumerate(keys):
            if self._ledger.drop(k) is not None:  # a write in flight removes what it put
                result[i] = True
            else:
                remote.append(i)
        if not remote:
            return result
        skeys = [self._skey(keys[i]) for i in remote]
        deadline = time.monotonic() + max(self._timeout - 1.0, 0.1)
        codes, conflicts = await self._run(partial(self._remove_work, skeys, deadline), what="batch_remove")
        self._c["lease_conflicts"] += conflicts
        first: BackendError | None = None
        for i, code in zip(remote, codes, strict=True):
            k = keys[i]
            if code == 0:
                entry = self._committed.pop(k, None)
                if entry is not None:
                    self._ledger.release(entry[0])
                self._c["evictions"] += 1
                result[i] = True
            elif code in _NOT_FOUND:
                self._lost(k)
            else:
                first = first or translate(code, op="remove", key=k, tier=self.name)
        if first is not None:
            raise first
        return result

    async def contains(self, key: str) -> bool:
        """``is_exist`` on the pool (blocks of other processes count too)."""
        self._check_open()
        validate_key(key, tier=self.name)
        store = self._store
        skey = self._skey(key)
        code = await self._run(lambda: int(store.is_exist(skey)), what="is_exist")
        if code == 1:
            return True
        if code == 0:
            self._lost(key)
            return False
        raise translate(code if code < -1 else -900, op="is_exist", key=key, tier=self.name)

    async def tag_of(self, key: str) -> bytes | None:
        """The tag stored with ``key`` by whichever process wrote it
        (:class:`tierkv.backend.SupportsTagLookup`), or None when the pool has no such
        block or its object fails verification (header, key binding, length,
        checksum: the whole object is read and checked, and a bad one is
        quarantined). Raises BackendIOError (master or peer failed, timeout)."""
        self._check_open()
        validate_key(key, tier=self.name)
        skey = self._skey(key)
        deadline = time.monotonic() + self._timeout

        def work() -> tuple[int, bytes | None]:
            staging, store = self._staging, self._store
            if staging is None or store is None:
                return -1, None
            size = int(store.get_size(skey))
            if size < 0:
                return size, None
            if size > staging.size // 2:
                return 0, None
            [off] = staging.alloc_many([size], deadline)
            try:
                [r] = [int(c) for c in store.batch_get_into([skey], [staging.ptr + off], [size])]
                if r < 0:
                    return r, None
                region = staging.view[off : off + r]
                problem, tlen, _ = self._verify(skey, region, r)
                if problem:
                    with contextlib.suppress(Exception):
                        store.remove(skey, True)
                    return 0, None
                return 0, bytes(region[HEADER_BYTES : HEADER_BYTES + tlen])
            finally:
                staging.free_many([off], [size])

        code, tag = await self._run(work, what="tag_of")
        if code in _NOT_FOUND:
            self._lost(key)
            return None
        if code < 0:
            raise translate(code, op="get", key=key, tier=self.name)
        if tag is None:
            self._c["integrity_failures"] += 1
        return tag

    def stats(self) -> BackendStats:
        details: dict[str, Any] = dict(self._c)
        details.update(
            {
                "protocol": self._protocol,
                "master": self._master_addr,
                "master_started": self._start_master,
                "metadata": self._metadata,
                "namespace": self._namespace,
                "rdma_devices": list(self._devices),
                "discovery": self._discovery,
                "checksum": _ALGO_LABEL[self._algo],
                "global_segment_size": self._segment,
                "staging_bytes": self._staging_bytes,
            }
        )
        for k in ("reads", "writes", "evictions", "bytes_read", "bytes_written"):
            details.pop(k)
        return BackendStats(
            tier=self.name,
            kind=TierKind.RDMA,
            capacity_bytes=self._capacity,
            used_bytes=self._ledger.used_bytes,
            blocks=len(self._committed),
            reserved_bytes=self._ledger.reserved_bytes,
            reads=self._c["reads"],
            writes=self._c["writes"],
            evictions=self._c["evictions"],
            bytes_read=self._c["bytes_read"],
            bytes_written=self._c["bytes_written"],
            io_path=f"mooncake {self._protocol}",
            emulated=self._protocol != "rdma",
            details=types.MappingProxyType(details),
        )

    # ------------------------------------------------------------ raw reference
    async def raw_reference(self, op: str, block_bytes: int, count: int, concurrency: int) -> RawMeasurement:
        """The raw Mooncake client on this backend's own connection
        (:class:`tierkv_conformance.SupportsRawReference`): the best it does with
        the batches the envelope gives the backend.

        Moves ``count`` objects of ``block_bytes`` in batches of
        ``certify_batch(block_bytes, count)`` objects (one ``batch_put_from`` /
        ``batch_get_into`` per batch) from and into this backend's registered
        arena, on the number of threads (powers of two up to ``concurrency``)
        that was fastest for this (op, size, batch, concurrency): chosen once by
        interleaved trials (median of 3) and remembered, so that the reference is
        the client at its best, not at a thread count that happens to suit it
        less (on a loopback the copy runs in one Mooncake memcpy thread, and 2
        callers can beat 4). No header, no checksum, no copy, no bookkeeping: the
        envelope's denominator. Reads put their objects first (untimed) and read
        each once per trial. Keys live under ``tierkv/<namespace>/__raw__`` and
        are removed afterwards.

        Raises InputError (bad arguments), BackendIOError (a call failed or
        the arena could not hold the buffers).
        """
        self._check_open()
        if op not in ("write", "read"):
            raise InputError(f"raw_reference: op must be 'write' or 'read', got {op!r}")
        if not 0 < block_bytes <= self._max_block or count < 1 or concurrency < 1:
            raise InputError(
                f"raw_reference: need 0 < block_bytes <= {self._max_block}, count >= 1 and concurrency >= 1"
            )
        staging, store = self._staging, self._store
        assert staging is not None
        per = certify_batch(block_bytes, count)
        most = max(1, min(concurrency, -(-count // per), (staging.size // 2) // (per * block_bytes)))
        if most * per * block_bytes > staging.size // 2 and per > 1:
            raise InputError(f"raw_reference: a batch of {per} x {block_bytes} B does not fit the staging arena")
        candidates = sorted({most, *(1 << i for i in range(most.bit_length()) if 1 << i <= most)})
        base = f"tierkv/{self._namespace}/__raw__{next(self._raw_runs)}"
        keys = [f"{base}.{i}" for i in range(count)]
        batches = [keys[i : i + per] for i in range(0, count, per)]
        ident = (op, block_bytes, per, count, concurrency)
        chosen = self._raw_threads.get(ident)
        deadline = time.monotonic() + self._timeout
        failed: list[int] = []

        def run(offs: list[int], threads: int) -> float:
            todo = iter(batches)
            lock = threading.Lock()

            def worker(off: int) -> None:
                ptrs = [staging.ptr + off + j * block_bytes for j in range(per)]
                while True:
                    with lock:
                        part = next(todo, None)
                    if part is None:
                        return
                    n = len(part)
                    if op == "write":
                        rc = store.batch_put_from(part, [ptrs[0]] * n, [block_bytes] * n)
                        bad = [int(c) for c in rc if int(c) != 0]
                    else:
                        rc = store.batch_get_into(part, ptrs[:n], [block_bytes] * n)
                        bad = [int(c) if int(c) < 0 else -600 for c in rc if int(c) != block_bytes]
                    if bad:
                        failed.append(bad[0])
                        return

            pool = [threading.Thread(target=worker, args=(off,)) for off in offs[:threads]]
            t0 = time.perf_counter()
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            seconds = time.perf_counter() - t0
            if op == "write":  # the next trial writes the same keys again
                store.batch_remove(keys, True)
            return seconds

        def work() -> tuple[float, int]:
            sizes = [per * block_bytes] * most
            offs = staging.alloc_many(sizes, deadline)
            for off in offs:
                staging.array[off : off + per * block_bytes] = 0x5A
            try:
                if op == "read":
                    for part in batches:
                        rc = store.batch_put_from(part, [staging.ptr + offs[0]] * len(part), [block_bytes] * len(part))
                        if any(int(c) != 0 for c in rc):
                            failed.append(min(int(c) for c in rc))
                            return 0.0, 0
                threads = chosen
                if threads is None:
                    trials: dict[int, list[float]] = {t: [] for t in candidates}
                    for r in range(3):
                        for t in candidates if r % 2 == 0 else candidates[::-1]:
                            trials[t].append(run(offs, t))
                            if failed:
                                return 0.0, 0
                    threads = min(candidates, key=lambda t: statistics.median(trials[t]))
                return run(offs, threads), threads
            finally:
                with contextlib.suppress(Exception):
                    store.batch_remove(keys, True)
                staging.free_many(offs, sizes)

        try:
            seconds, threads = await self._run(work, what="raw_reference")
        except TimeoutError as exc:  # the arena stayed busy past the deadline
            raise BackendIOError(f"raw_reference: {exc}", tier=self.name) from exc
        if failed:
            raise BackendIOError(f"raw {op} failed: {code_name(failed[0])}", tier=self.name)
        self._raw_threads[ident] = threads
        tried = "/".join(str(t) for t in candidates)
        method = (
            f"mooncake {'batch_put_from' if op == 'write' else 'batch_get_into'} ({self._protocol}), "
            f"batches of {per}, {threads} thread{'s' if threads > 1 else ''} (fastest of {tried}), registered buffers"
        )
        return RawMeasurement(block_bytes * count, seconds, method)
