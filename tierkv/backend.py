"""The plugin-author API (``tierkv.backend``): the tier backend protocol and its helpers.

A backend stores opaque byte blocks under keys in one tier of the memory
hierarchy (GPU HBM, host DRAM, CXL memory, NVMe, an RDMA pool, a parallel
filesystem, or anything a third party plugs in). It knows nothing of tokens,
models or placement: the core decides what goes where, and when something
leaves. A third-party backend subclasses :class:`Backend`, implements the
abstract methods below, registers the class under the ``tierkv.backends``
entry-point group, and certifies itself with ``tierkv certify NAME``.

A backend imports from tierkv only this module and :mod:`tierkv.errors`. What is here:

* the protocol: :class:`Backend`, :class:`Capabilities`, :class:`Allocation`,
  :class:`BlockInfo`, :class:`BackendStats`, :class:`OpenContext`,
  :class:`Availability`, :class:`TierKind`, the optional ``Supports*`` protocols,
  :data:`API_VERSION`, :data:`MAX_TAG_BYTES`;
* the checks every backend makes: :func:`validate_key`, :func:`check_allocation`,
  :func:`as_byte_view`, :func:`into_view`;
* shared mechanisms: :class:`ReservationLedger` (the reservation and capacity
  bookkeeping), :func:`os_error` (the one ``OSError`` mapper), :func:`run_blocking`
  (abandonable worker-thread calls), :func:`tag_tenant` (the only field of the
  core's opaque block tags a backend may read);
* option readers for ``__init__``: :func:`opt_size`, :func:`opt_int`,
  :func:`opt_float`, :func:`opt_bool`, :func:`opt_str`, :func:`opt_path`,
  :func:`opt_choice`, :func:`parse_size`, :func:`reject_unknown`, :func:`config_path`;
* discovery: :func:`load_backend_class`, :func:`validate_backend_class`;
* what ``tierkv certify`` may be told (never its pass rule, which the suite owns
  per tier kind): :class:`CertificationProfile`, :class:`SupportsRawReference`,
  :class:`RawMeasurement`, :func:`certify_batch`.

Contract shared by every method
-------------------------------
* Keys are ``str`` of 1 to 128 characters from ``[0-9a-zA-Z._-]``; the core
  passes 64 lower-case hex digits. Keys are safe as file names and network keys.
* Every failure is a :class:`~tierkv.TierKVError` subclass; foreign exceptions
  (``OSError``, a client library's errors or status codes) are translated at the
  boundary and chained (``raise BackendIOError(...) from exc``).
* After :meth:`Backend.aclose` every method except ``aclose`` and ``stats``
  raises :class:`~tierkv.BackendClosedError`; ``aclose`` is idempotent.
* Methods are safe to call concurrently from many tasks of one event loop, on
  distinct keys and on the same key. Blocking work (syscalls, file and device
  I/O, client calls) runs in worker threads through
  ``anyio.to_thread.run_sync`` with a limiter sized by
  :attr:`Capabilities.max_concurrency`; the event loop is never blocked on
  I/O. Plain memory copies may run on the event loop in bounded slices (a
  memory tier's ``inline_copy_bytes``, about 100 µs of memcpy, less than one
  thread hop costs) with a checkpoint between slices.
* Cancellation: a cancelled or failed :meth:`Backend.write` leaves nothing
  visible under the key and releases its reservation; a cancelled read or
  evict leaves the stored block as it was or removed, never half removed.
  A read honours its caller's deadline even while the medium stalls: a read
  into the backend's own buffers (``into=None``) that is cancelled returns at
  once; its worker thread finishes in the background into those buffers,
  which nobody sees any more, and the result is discarded (see
  :func:`run_blocking`). A read into a caller's buffer (``into=``) is never
  abandoned: the buffer must not be written after the call returns, so it
  returns once its I/O is done. A worker thread left running keeps its slot of
  the backend's limiter until it really ends.
* Errors of the operating system are translated by :func:`os_error`: a full
  medium (``ENOSPC``, ``EDQUOT``) is a capacity condition,
  :class:`~tierkv.CapacityError`, never a device failure; every other
  ``OSError`` is a :class:`~tierkv.BackendIOError`.
* A backend never evicts on its own: eviction is the core's decision. A shared
  remote store that loses a block by itself (its own pressure eviction) reports
  it as :class:`~tierkv.BlockNotFoundError`, never as wrong bytes.
"""

from __future__ import annotations

import math
import types
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

import numpy as np

from ._blocking import os_error, run_blocking
from ._certification import (
    CERTIFY_BATCH_BYTES,
    CertificationProfile,
    RawMeasurement,
    SupportsRawReference,
    certify_batch,
)
from ._checks import MAX_TAG_BYTES, as_byte_view, check_allocation, into_view, validate_key
from ._device import copy as device_copy
from ._device import host_view, is_device_tensor
from ._ledger import Allocation, Reservation, ReservationLedger
from ._options import (
    config_path,
    opt_bool,
    opt_choice,
    opt_float,
    opt_int,
    opt_path,
    opt_size,
    opt_str,
    parse_size,
    reject_unknown,
)
from .errors import BackendClosedError, BackendError, InputError

__all__ = [
    "API_VERSION",
    "CERTIFY_BATCH_BYTES",
    "MAX_TAG_BYTES",
    "Allocation",
    "Availability",
    "Backend",
    "BackendStats",
    "BlockInfo",
    "Buffer",
    "Capabilities",
    "CertificationProfile",
    "OpenContext",
    "RawMeasurement",
    "Reservation",
    "ReservationLedger",
    "SupportsContentHash",
    "SupportsArrayIO",
    "SupportsDeviceIO",
    "SupportsRawReference",
    "SupportsScan",
    "SupportsTagLookup",
    "Taken",
    "TierKind",
    "as_byte_view",
    "certify_batch",
    "check_allocation",
    "config_path",
    "device_copy",
    "host_view",
    "into_view",
    "is_device_tensor",
    "load_backend_class",
    "opt_bool",
    "opt_choice",
    "opt_float",
    "opt_int",
    "opt_path",
    "opt_size",
    "opt_str",
    "os_error",
    "parse_size",
    "reject_unknown",
    "run_blocking",
    "tag_tenant",
    "validate_backend_class",
    "validate_key",
]

#: Version of this protocol. A backend declares the version it implements in
#: ``Backend.api_version``; the registry refuses a mismatch.
API_VERSION = 1

#: Host buffers accepted by ``write`` and ``read(into=...)``: anything exposing
#: the buffer protocol with C-contiguous memory (bytes, bytearray, memoryview,
#: a C-contiguous numpy array; a CPU torch tensor through ``tensor.numpy()``).
Buffer = bytes | bytearray | memoryview | np.ndarray[Any, Any]


class TierKind(StrEnum):
    """Which level of the hierarchy a backend serves (fastest first)."""

    HBM = "hbm"
    DRAM = "dram"
    CXL = "cxl"
    NVME = "nvme"
    RDMA = "rdma"
    PFS = "pfs"
    REMOTE = "remote"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend declares about itself; the conformance suite and the
    scheduler read it.

    Attributes:
        tier_kind: the level of the hierarchy.
        persistent: committed blocks survive ``aclose`` and a process crash;
            the backend then also implements :class:`SupportsScan`, and a
            ``write`` returns only once the block is durable.
        shared: blocks are visible to other processes or hosts using the same
            configuration (a network pool, a shared filesystem).
        device_resident: blocks live in accelerator memory; the backend also
            implements :class:`SupportsDeviceIO`.
        alignment: the I/O alignment in bytes the medium prefers (1 for memory).
        max_block_bytes: the largest block ``allocate`` accepts.
        max_concurrency: worker threads / in-flight I/Os the backend uses.

    Nothing here grades a backend: ``tierkv certify`` owns its pass rule, by
    ``tier_kind`` (see :class:`CertificationProfile` for what a backend may tell it).
    """

    tier_kind: TierKind
    persistent: bool = False
    shared: bool = False
    device_resident: bool = False
    alignment: int = 1
    max_block_bytes: int = 1 << 30
    max_concurrency: int = 8


@dataclass(frozen=True, slots=True)
class OpenContext:
    """What the core tells a backend about the data it will hold, at :meth:`Backend.open`.

    Attributes:
        block_nbytes: the largest payload of one block the core writes to this tier: the
            model's KV block at the configured dtype (for a tier with a codec, the codec's
            bound for it). A backend that sizes storage units by block (the nvme tier's
            slots) derives them from it when its options do not say. None when unknown
            (a backend opened on its own, by a test or the conformance suite).
    """

    block_nbytes: int | None = None

    def __post_init__(self) -> None:
        b = self.block_nbytes
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise InputError(f"OpenContext.block_nbytes must be a positive int or None, got {b!r}")


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a backend can run on this machine, and if not why and what would fix it."""

    usable: bool
    reason: str = ""
    hint: str = ""


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """One committed block as reported by :meth:`SupportsScan.scan`."""

    key: str
    nbytes: int
    tag: bytes = b""


@dataclass(frozen=True, slots=True)
class BackendStats:
    """A snapshot of a backend's accounting.

    ``used_bytes`` counts committed blocks plus pending reservations;
    ``reserved_bytes`` is the pending part. ``io_path`` names the data path in
    use (``"memcpy"``, ``"O_DIRECT preadv/pwritev"``, ``"kvikio cuFile (GDS)"``,
    ``"mooncake tcp"``, ...); ``emulated`` is true when the backend runs on a
    stand-in for its real hardware. ``details`` holds backend-specific numbers.
    """

    tier: str
    kind: TierKind
    capacity_bytes: int
    used_bytes: int
    blocks: int
    reserved_bytes: int = 0
    reads: int = 0
    writes: int = 0
    evictions: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    io_path: str = ""
    emulated: bool = False
    details: Mapping[str, Any] = field(default_factory=lambda: types.MappingProxyType({}))


class Backend(ABC):
    """Abstract async tier backend. Subclass it; see the module docstring for the
    contract every method shares.

    Construction does no I/O: ``__init__(options, *, name)`` only validates the
    options (raising :class:`~tierkv.ConfigError` naming the field).
    :meth:`open` is the async constructor that acquires resources (files,
    memory, connections); use ``backend = await MyBackend.open(options)`` and
    ``await backend.aclose()`` (or ``async with``).

    Subclasses implement :meth:`_open` and :meth:`_close` (both optional),
    :attr:`capabilities`, :meth:`allocate`, :meth:`write`, :meth:`read`,
    :meth:`evict`, :meth:`contains` and :meth:`stats`; they call
    :meth:`_check_open` at the top of every data method.
    """

    #: The protocol version implemented (see :data:`API_VERSION`).
    api_version: ClassVar[int] = API_VERSION
    #: How ``tierkv certify`` sets this backend up (descriptive; the pass rule is the suite's).
    certification: ClassVar[CertificationProfile] = CertificationProfile()

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        self.name = name or type(self).__name__.lower()
        self.options: Mapping[str, Any] = dict(options or {})
        #: what the core said at open (:class:`OpenContext`); read it in :meth:`_open`
        self.context = OpenContext()
        self._closed = False
        self._opened = False

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def open(
        cls, options: Mapping[str, Any] | None = None, *, name: str = "", context: OpenContext | None = None
    ) -> Self:
        """Create and open a backend. ``context`` (keyword, optional) tells it about the
        data it will hold (:class:`OpenContext`); it is in :attr:`context` when
        :meth:`_open` runs. Raises ConfigError, PluginUnavailableError (hardware or
        library missing), BackendIOError, or CapacityError (the medium cannot hold the
        configured capacity). A failed open leaves nothing behind that it created."""
        backend = cls(options, name=name)
        if context is not None:
            if not isinstance(context, OpenContext):
                raise InputError(f"context must be an OpenContext, got {type(context).__name__}")
            backend.context = context
        await backend._open()
        backend._opened = True
        return backend

    async def _open(self) -> None:  # noqa: B027 - optional hook
        """Acquire resources. Called once by :meth:`open`."""

    async def _close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Called once by :meth:`aclose`; persistent data stays."""

    async def aclose(self) -> None:
        """Close the backend; idempotent. Persistent backends keep committed blocks
        on their medium; pending reservations are dropped."""
        if self._closed:
            return
        self._closed = True
        await self._close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        """Raise :class:`~tierkv.BackendClosedError` if the backend was closed."""
        if self._closed:
            raise BackendClosedError("backend is closed", tier=self.name)

    # -------------------------------------------------------------- declaration
    @classmethod
    def probe(cls) -> Availability:
        """Say, cheaply and without side effects, whether this backend can run here.

        Detect hardware and optional libraries honestly (never guess). The
        default says usable.
        """
        return Availability(True)

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        """Options for a safe, self-contained instance under ``workdir`` (used by
        ``tierkv certify`` when no config is given). Raise PluginUnavailableError
        if there is none on this machine."""
        return {"capacity": 256 * 1024 * 1024}

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """The backend's declared capabilities (constant over its lifetime)."""

    # -------------------------------------------------------------------- data
    @abstractmethod
    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        """Reserve ``nbytes`` for ``key``; the block is not visible until :meth:`write`.

        ``tag`` (at most :data:`MAX_TAG_BYTES` bytes) is stored with the block and
        returned by ``scan``. Capacity accounting is exact: the reservation counts
        in ``used_bytes`` until it is written or dropped by :meth:`evict`, and
        evicting it returns ``used_bytes`` to its previous value. A backend that
        allocates in units of a granule (pages, slots) counts ``nbytes`` rounded
        up to it and declares it as ``stats().details["granule"]``.

        Raises:
            InputError: invalid key, negative ``nbytes``, ``nbytes`` above
                ``max_block_bytes``, or a tag that is too long.
            BlockExistsError: a committed block or a reservation exists for ``key``.
            CapacityError: not enough free capacity.
            BackendClosedError, BackendIOError.
        """

    @abstractmethod
    async def write(self, allocation: Allocation, data: Buffer) -> None:
        """Write ``data`` (exactly ``allocation.nbytes`` bytes) and commit the block.

        On return the block is visible to :meth:`read` (and durable, for
        persistent backends). If the write fails or is cancelled, nothing is
        visible under the key and the reservation is released (also when
        ``data`` is rejected for its length: allocate again to retry).

        Raises:
            InputError: ``data`` has the wrong length or is not a contiguous buffer.
            BlockNotFoundError: the allocation is unknown (already written, or
                dropped by ``evict``).
            BackendClosedError, BackendIOError.
        """

    @abstractmethod
    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        """Return the committed bytes of ``key``.

        Without ``into`` the result owns a fresh buffer. With ``into`` (a writable
        contiguous buffer of at least the block's size) the bytes are copied
        straight into it and the result is a view of its first ``nbytes`` bytes.

        Raises:
            BlockNotFoundError: no committed block (never written, evicted, or
                lost by a shared store).
            InputError: ``into`` is too small, read-only or not contiguous.
            IntegrityError: the stored bytes failed verification (the block is
                quarantined and not served again).
            BackendClosedError, BackendIOError.
        """

    @abstractmethod
    async def evict(self, key: str) -> bool:
        """Remove the block or pending reservation under ``key`` and free its space.

        Idempotent: returns ``True`` if something was removed, ``False`` if
        nothing was there. Raises InputError, BackendClosedError, BackendIOError.
        """

    @abstractmethod
    async def contains(self, key: str) -> bool:
        """Whether a committed block exists under ``key`` (reservations do not count)."""

    @abstractmethod
    def stats(self) -> BackendStats:
        """A snapshot of the accounting. Never does I/O; works after close."""

    # ------------------------------------------------------------- batch twins
    async def allocate_many(self, items: Sequence[tuple[str, int, bytes]]) -> list[Allocation]:
        """Reserve several blocks, all or nothing: on failure the reservations
        already made are dropped and the error is raised."""
        done: list[Allocation] = []
        try:
            for key, nbytes, tag in items:
                done.append(await self.allocate(key, nbytes, tag=tag))
        except BaseException:
            for a in done:
                try:
                    await self.evict(a.key)
                except BackendError:
                    pass
            raise
        return done

    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """Write several blocks. Each block commits independently; on failure the
        blocks not yet committed are released."""
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        i = 0
        try:
            for i, (a, d) in enumerate(zip(allocations, datas, strict=True)):  # noqa: B007
                await self.write(a, d)
        except BaseException:
            for a in allocations[i + 1 :]:
                try:
                    await self.evict(a.key)
                except BackendError:
                    pass
            raise

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """Read several blocks; same errors as :meth:`read` (the first failure raises)."""
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        out: list[memoryview] = []
        for i, k in enumerate(keys):
            out.append(await self.read(k, into=None if into is None else into[i]))
        return out

    async def evict_many(self, keys: Sequence[str]) -> list[bool]:
        """Evict several keys; idempotent like :meth:`evict`."""
        return [await self.evict(k) for k in keys]

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._opened else "new")
        return f"<{type(self).__name__} {self.name!r} {state}>"


@runtime_checkable
class SupportsScan(Protocol):
    """A persistent backend lists its committed blocks so a new process can
    rebuild its index (warm start, crash recovery)."""

    async def scan(self) -> list[BlockInfo]:
        """Every committed block. Never lists torn or uncommitted blocks."""
        ...


@runtime_checkable
class SupportsDeviceIO(Protocol):
    """A backend that moves blocks to and from accelerator tensors: every
    device-resident backend (HBM, without a host bounce), and storage tiers with
    a direct path (NVMe through kvikio/GPUDirect Storage; on its POSIX path it
    bounces through host memory). Same errors, durability and cancellation as
    ``write`` / ``read``; a tensor that is not a contiguous device tensor of the
    right size raises InputError."""

    async def write_device(self, allocation: Allocation, tensor: Any) -> None:
        """Like :meth:`Backend.write` from a device tensor (uint8, contiguous)."""
        ...

    async def read_device(self, key: str, *, into: Any) -> Any:
        """Like :meth:`Backend.read` into a device tensor; returns a view of ``into``."""
        ...


@dataclass(frozen=True, slots=True)
class Taken:
    """The elements ``np.take(array, index, axis=axis)`` gives, in C order, not taken yet:
    a part of a block gathered from ``array`` at ``index`` along ``axis`` (or, read back,
    scattered there), such as a chunk of engine blocks of a paged cache. A backend copies
    it with ``np.take(..., out=)`` and an indexed assignment: one copy, in C."""

    array: np.ndarray[Any, Any]
    index: np.ndarray[Any, Any]
    axis: int
    #: the shape of the taken elements (``array``'s, ``len(index)`` along ``axis``)
    shape: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: their size in bytes
    nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        a, idx, axis = self.array, self.index, self.axis
        if not 0 <= axis < a.ndim:
            raise InputError(f"Taken: axis {axis} is outside an array of {a.ndim} axes")
        n = a.shape[axis]
        if idx.ndim != 1:
            raise InputError(f"Taken: the index must be 1-D ids in [0, {n}) along axis {axis}")
        if idx.size:
            # a chunk of engine blocks has a few ids: Python's min/max of them beat two numpy reductions
            ids = idx.tolist() if idx.size <= 64 else (int(idx.min()), int(idx.max()))
            if min(ids) < 0 or max(ids) >= n:
                raise InputError(f"Taken: the index must be 1-D ids in [0, {n}) along axis {axis}")
        shape = (*a.shape[:axis], len(idx), *a.shape[axis + 1 :])
        object.__setattr__(self, "shape", shape)  # (computed once: copy loops ask per part)
        object.__setattr__(self, "nbytes", math.prod(shape) * a.itemsize)

    def gather_into(self, out: np.ndarray[Any, Any]) -> None:
        """Copy the taken elements into ``out`` (an array of :attr:`shape`)."""
        a = self.array
        if a.flags.c_contiguous:
            # ids checked at construction: "clip" never clips, and unlike "raise" does not
            # buffer ``out`` (numpy copies through a temporary then)
            np.take(a, self.index, axis=self.axis, out=out, mode="clip")
            return
        # np.take copies a non-contiguous array whole before it gathers (the layers of a paged
        # cache stacked over the gaps between them: every layer of every block, per block);
        # index by index instead, each a strided copy of only the taken elements
        lead: tuple[Any, ...] = (slice(None),) * self.axis
        for j, b in enumerate(self.index.tolist()):
            np.copyto(out[(*lead, j)], a[(*lead, b)])

    def scatter_from(self, src: np.ndarray[Any, Any]) -> None:
        """Write ``src`` (an array of :attr:`shape`) back where the elements were taken from."""
        idx: list[Any] = [slice(None)] * self.array.ndim
        idx[self.axis] = self.index
        self.array[tuple(idx)] = src


@runtime_checkable
class SupportsArrayIO(Protocol):
    """A memory backend that copies blocks straight between its own memory and numpy
    arrays of any strides: one copy each way, no contiguous intermediate. A block is given
    as one array (its bytes are the array's elements in C order) or as a sequence of
    arrays and :class:`Taken` parts (their bytes one after the other), e.g. the engine
    blocks of a paged cache. The
    core uses it to gather a block from a view of the caller's KV or cache and to scatter
    it into the caller's ``out`` or cache. Same contracts as :meth:`Backend.write_many` /
    :meth:`Backend.read_many` (all-or-nothing commit, errors, cancellation); arrays whose
    bytes do not add up to the block's, or a read-only destination, raise InputError.

    A block may also come as an accelerator tensor (:func:`is_device_tensor`: the caller's
    KV on a GPU): copy it with :func:`device_copy` to or from :func:`host_view` of the
    block's memory, in a worker thread (the copy blocks until the device completes it);
    the DRAM tier's memory is page-locked when a CUDA device is present, so that copy is
    one DMA each way."""

    async def write_arrays(self, allocations: Sequence[Allocation], arrays: Sequence[Any]) -> None:
        """Commit each allocation with the elements of the matching array(s)."""
        ...

    async def read_arrays(self, keys: Sequence[str], arrays: Sequence[Any]) -> None:
        """Copy each committed block into the matching writable array(s)."""
        ...


@runtime_checkable
class SupportsContentHash(Protocol):
    """A backend tells the content hash of a committed block (checkpoint manifests
    reference blocks by it). A content-addressed store answers from its index;
    others may read the block (verified, like ``read``) and hash it."""

    async def content_hash(self, key: str) -> str | None:
        """``"sha256"`` hex digest of the block's bytes, or None if absent (or, for a
        backend that reads to answer, when the block fails verification). Raises
        BackendClosedError, BackendIOError."""
        ...


@runtime_checkable
class SupportsTagLookup(Protocol):
    """A shared backend (``capabilities.shared``) tells the tag of a block that
    another process committed, so this process can adopt the block into its
    index (the core's lookup/get consult it where the local index misses)."""

    async def tag_of(self, key: str) -> bytes | None:
        """The tag stored with the committed block ``key``, or None when absent
        (or when the block fails the backend's own verification). Raises
        BackendError when the tier fails."""
        ...


# ------------------------------------------------------------------------ the tag
def tag_tenant(tag: bytes) -> bytes | None:
    """The tenant of a block from its tag, when :class:`~tierkv.TierKV` wrote the tag; else None.

    Tags are opaque to a backend: it stores them and gives them back (``scan``,
    ``tag_of``). The one question a backend may ask of one is whose block it is: a
    backend that shares storage between blocks of equal content (the ``pfs`` tier's
    deduplication) shares it only between blocks of the same tenant. Pure.
    """
    from ._engine._tags import tag_tenant as tenant_of  # the core owns the tag format

    return tenant_of(tag)


# ------------------------------------------------------------------ discovery
def load_backend_class(name: str) -> type[Backend]:
    """The backend class registered as ``name`` in the ``tierkv.backends`` entry-point
    group, imported and validated (:func:`validate_backend_class`), as the core loads it.

    Raises :class:`~tierkv.PluginNotFoundError`, :class:`~tierkv.PluginConflictError`,
    :class:`~tierkv.PluginUnavailableError` (the import failed; ``hint`` says what to
    install) or :class:`~tierkv.PluginValidationError`.
    """
    from ._registry import load_backend_class as load

    return load(name)


def validate_backend_class(obj: object, *, name: str = "", distribution: str = "") -> type[Backend]:
    """Check that ``obj`` is a concrete :class:`Backend` subclass of this :data:`API_VERSION`
    with async data methods and a plain ``stats``; return it typed. Raises
    :class:`~tierkv.PluginValidationError` naming what is wrong."""
    from ._registry import validate_backend_class as validate

    return validate(obj, name=name, distribution=distribution)


# the names re-exported from private modules are documented as this module's (as httpx does)
for _name in __all__:
    _obj = globals()[_name]
    if str(getattr(_obj, "__module__", "")).startswith("tierkv._"):
        _obj.__module__ = __name__
del _name, _obj
