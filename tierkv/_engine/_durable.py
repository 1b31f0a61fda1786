"""Writes and durability: storing a block, write-through, verified adoption, recovery.

Owns: writing a new block to the fastest tier with room (``write_to_fastest``),
indexing it (``store_block``), waiting for a concurrent writer of the same block,
the durable copy of ``put(durable=True)`` (``make_durable``), adopting an existing
copy only after it verifies, accounting every copy written (``attach_copy``: a copy
is indexed or freed), and rebuilding the index from persistent tiers (``recover``).

May not touch: relocation decisions (the mover's), the read path.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.lowlevel
import numpy as np

from .._device import contiguous_bytes, is_device_tensor, to_host
from ..backend import SupportsArrayIO, SupportsDeviceIO, SupportsScan, Taken
from ..errors import (
    BackendError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    IntegrityError,
)
from ..scheduler._buckets import PROVISIONAL_RANK
from ._index import Entry
from ._tags import ZERO16, checked_tag, tag_checked, tag_checksum, tag_crc, tag_exact, tag_tenant, unpack_tag

if TYPE_CHECKING:
    from ._store import Store

log = logging.getLogger("tierkv")

#: a block's raw bytes: flat; an array of any strides whose elements in C order they are; or
#: parts (arrays, :class:`~tierkv.backend.Taken` engine blocks) whose bytes follow each other
BlockData = memoryview | np.ndarray[Any, Any] | list[Taken | np.ndarray[Any, Any]]


def nbytes_of(data: BlockData) -> int:
    return sum(p.nbytes for p in data) if isinstance(data, list) else data.nbytes


def flat(data: BlockData) -> memoryview:
    """The raw bytes of ``data`` as one flat buffer (a copy unless it is one already; for an
    accelerator tensor, a copy to host memory, blocking)."""
    if isinstance(data, memoryview):
        return data
    if is_device_tensor(data):
        return to_host(data)
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    buf = np.empty(nbytes_of(data), dtype=np.uint8)
    off = 0
    for t in data:
        dst = buf[off : off + t.nbytes]
        if isinstance(t, Taken):
            t.gather_into(dst.view(t.array.dtype).reshape(t.shape))
        else:
            np.copyto(dst.view(t.dtype).reshape(t.shape), t)
        off += t.nbytes
    return buf.data


__all__ = ["Durable"]


class Durable:
    """Stores blocks and their durable copies (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s

    async def store_block(
        self,
        key: str,
        data: BlockData,
        tag: bytes,
        pos: int,
        tid: bytes,
        parent: bytes,
        durable: bool,
        root: bytes,
        label: int | None,
    ) -> bool | None:
        """Write one block and index it. Returns True if written, False if it was
        already stored (only its durable copy was added), None if another task
        holds a reservation for it."""
        e = self.s.index.entries.get(key)
        if e is None:
            placed = await self.write_to_fastest(key, data, tag, 0)
            if placed is None:
                return None
            ti, tag = placed
            e, written = await self._index_written(key, ti, nbytes_of(data), tag, pos, tid, parent, root, label)
        else:
            written = False
        if durable and e.backing < 0:
            await self.make_durable(e, data, tag)
        return written

    async def _index_written(
        self,
        key: str,
        ti: int,
        nbytes: int,
        tag: bytes,
        pos: int,
        tid: bytes,
        parent: bytes,
        root: bytes,
        label: int | None,
    ) -> tuple[Entry, bool]:
        """Index the copy of ``key`` just committed on tier ``ti``: (a new entry, True), or, when
        another task indexed the block meanwhile (same key, same bytes), (that entry, False) and
        our copy is kept only if it is one of that entry's copies or can be its durable copy."""
        e = self.s.index.entries.get(key)
        if e is not None:
            await self.attach_copy(e, ti)
            return e, False
        e = Entry(key, ti, nbytes, tag, self.s.model_scope, tid, parent, pos, tag_crc(tag))
        e.label = label
        e.t_last = self.s.sched.now()  # the most recent block, until the put records its access
        if self.s.tiers[ti].backend.capabilities.persistent:
            e.backing = ti
        self.s.index.adopt(e, root)
        # ranked on top until the put records its access (Reader.record_access re-keys it): a
        # put's later blocks never evict its earlier ones while other blocks remain
        e.rank = PROVISIONAL_RANK - pos
        self.s.mover.arc_stored(e)
        self.s.tiers[ti].place(e)
        return e, True

    async def store_batch(
        self,
        items: list[tuple[str, BlockData, bytes, int, bytes]],
        tid: bytes,
        root: bytes,
        label: int | None,
    ) -> list[bool]:
        """Write the leading ``items`` (key, array of any strides, tag without checksum, position,
        parent key) to the fastest healthy tier with one allocation
        (:meth:`~tierkv._engine._mover.Mover.allocate_many_with_room`: a full tier sheds once for
        the batch) and one :meth:`~tierkv.backend.SupportsArrayIO.write_arrays` call (a tier that
        copies a large batch on two cores, the DRAM tier's ``split``, does so), then index them as
        :meth:`store_block` does. Returns, for each leading item stored and indexed, whether it is
        a new entry (False: another task indexed the block meanwhile); the caller stores the rest
        one by one (the batch stops before a block indexed already; none is stored when the
        batch cannot be allocated whole, see ``allocate_many_with_room``; no batch for a tier that
        is not a healthy array tier without codec or checksum, nor for a tenant with a quota; a
        failed write stores none).

        Cancellation: a cancel before the call stores nothing and sheds nothing. The allocation
        and the indexing are shielded. The copy is shielded only when the tier had to shed blocks
        for the batch (their room is not thrown away: the caller keeps such batches small); else
        a cancel during it frees the batch's allocations (the backend's all-or-nothing write) and
        is raised, no block of the batch stored."""
        ti = next((i for i, t in enumerate(self.s.tiers) if t.healthy), -1)
        if ti < 0:
            return []
        t = self.s.tiers[ti]
        if t.codec is not None or self.s.needs_checksum(ti) or not t.array_io:
            return []
        if self.s.quota_for(tid) is not None:
            return []  # a tenant under a quota makes room block by block, within its own blocks
        await anyio.lowlevel.checkpoint_if_cancelled()  # (a cancelled put sheds nothing for its batch)
        entries = self.s.index.entries
        n = 0
        while n < len(items) and entries.get(items[n][0]) is None:
            n += 1
        st = t.backend.stats()
        sheds = sum(nbytes_of(data) for _, data, _, _, _ in items[:n]) > st.capacity_bytes - st.used_bytes
        with anyio.CancelScope(shield=True):
            try:
                allocs = await self.s.mover.allocate_many_with_room(
                    ti, [(key, nbytes_of(data), tag) for key, data, tag, _, _ in items[:n]]
                )
            except BackendError as exc:
                self.s.tier_failed(ti, exc)
                return []
        n = len(allocs)
        if n == 0:
            return []
        try:
            with anyio.CancelScope(shield=sheds):
                await cast("SupportsArrayIO", t.backend).write_arrays(allocs, [d for _, d, _, _, _ in items[:n]])
        except BlockNotFoundError:
            return []  # a reservation was dropped by a concurrent evict: the backend freed the rest
        except BackendError as exc:
            self.s.tier_failed(ti, exc)
            return []
        out = []
        with anyio.CancelScope(shield=True):
            for key, data, tag, pos, parent in items[:n]:
                nbytes = nbytes_of(data)
                t.bytes_in += nbytes
                self.s.tel.bytes_written.add(nbytes, {"tier": t.name})
                out.append((await self._index_written(key, ti, nbytes, tag, pos, tid, parent, root, label))[1])
        return out

    async def await_concurrent_store(
        self, key: str, store: Callable[[], Awaitable[bool | None]], data: BlockData, tag: bytes, durable: bool
    ) -> None:
        """Wait (at most 30 s, then TimeoutError) until the block ``key``, which another task
        holds a reservation for, is indexed; then make it durable if ``durable``. If the other
        task gives up, ``store()`` stores it here."""
        with anyio.fail_after(30):
            while True:
                await anyio.sleep(0.002)
                e = self.s.index.entries.get(key)
                if e is None:
                    with anyio.CancelScope(shield=True):
                        placed = await store()
                    if placed is None:
                        continue  # still being written by the other task
                    return  # stored (and made durable) here
                if durable and e.backing < 0:
                    with anyio.CancelScope(shield=True):
                        await self.make_durable(e, data, tag)
                return

    async def make_durable(self, e: Entry, data: BlockData, tag: bytes) -> None:
        """Write the durable copy of ``e`` to the fastest persistent tier below its
        serving tier that has room. If another task is writing that copy right
        now, wait for it (bounded). Raises CapacityError when no persistent tier
        can take it."""
        key = e.key
        with anyio.fail_after(30):
            while e.backing < 0:
                busy = False
                for bi in range(e.tier + 1, len(self.s.tiers)):
                    t = self.s.tiers[bi]
                    if not (t.healthy and t.backend.capabilities.persistent):
                        continue
                    try:
                        placed = await self.write_to_fastest(key, data, e.tag, bi, only=True)
                    except CapacityError:
                        continue
                    if placed is None:
                        busy = True  # another put of the same block is writing it there
                        continue
                    if self.s.index.entries.get(key) is e:
                        self.s.mover.commit_copy_bytes(e, placed[1])  # the checksum it now carries
                    await self.attach_copy(e, bi)
                    break
                if e.backing >= 0 and self.s.index.entries.get(key) is e:
                    return
                if self.s.index.entries.get(key) is not e:
                    # dropped meanwhile by capacity pressure: index it again, durably this time
                    again = await self.write_to_fastest(key, data, e.tag, 0)
                    if again is not None:
                        ti = again[0]
                        cur = self.s.index.entries.get(key)
                        if cur is None:
                            self.s.mover.commit_copy_bytes(e, again[1])
                            e.tier, e.backing, e.pins, e.moving = ti, -1, 0, False
                            if self.s.tiers[ti].backend.capabilities.persistent:
                                e.backing = ti
                            self.s.index.adopt(e, b"")
                            self.s.mover.arc_stored(e)
                            self.s.tiers[ti].place(e)
                        else:
                            await self.attach_copy(cur, ti)
                        e = self.s.index.entries.get(key, e)
                    continue
                if not busy:
                    raise CapacityError(f"put(durable=True): no persistent tier has room for block {key[:16]}")
                await anyio.sleep(0.005)

    async def write_to_fastest(
        self, key: str, data: BlockData, tag: bytes, start: int, *, only: bool = False
    ) -> tuple[int, bytes] | None:
        """Write to the fastest healthy tier at or below ``start`` with room (only
        ``start`` with ``only``): (the tier, the tag written there), or None if a
        reservation for ``key`` exists elsewhere.

        New blocks are the most recently used, so when a tier is full (or too
        fragmented) its lowest-ranked blocks move down first; the space made is
        reserved for this write (:meth:`_allocate_with_room`). A tier that verifies
        its reads gets a checksummed tag (computed here once if ``tag`` has none).
        A copy the tier already holds under ``key`` is adopted only after it
        verifies against ``data``'s checksum; otherwise it is replaced. ``data`` given
        as an array of any strides goes to a tier without a codec that supports it
        (:class:`~tierkv.backend.SupportsArrayIO`) in one copy, gathered by the tier.
        """
        last_exc: BaseException | None = None
        tid = tag_tenant(tag) or ZERO16
        nbytes = nbytes_of(data)
        raw = data if isinstance(data, memoryview) else None  # the flat bytes, made at most once
        on_device = is_device_tensor(data)

        async def raw_bytes() -> memoryview:
            nonlocal raw
            if raw is None:  # an accelerator block's staging copy to the host runs in a worker thread
                raw = await anyio.to_thread.run_sync(flat, data) if on_device else flat(data)
            return raw

        for ti in [start] if only else range(start, len(self.s.tiers)):
            t = self.s.tiers[ti]
            if not t.healthy:
                continue
            if not await self.s.quotas.quota_room(tid, ti, nbytes):
                last_exc = CapacityError(
                    f"tenant {self.s.tenant_label(tid)!r} is at its quota on tier {t.name!r} "
                    "and has no block of its own left to evict"
                )
                continue
            if self.s.needs_checksum(ti) and not tag_checked(tag):
                tag = checked_tag(tag, await raw_bytes())
            direct = raw is None and t.codec is None and t.array_io
            # an accelerator block to a device-resident tier stays on the device
            device_io = on_device and raw is None and t.codec is None and not direct
            device_io = device_io and t.device_io
            payload = None if direct or device_io else await self.s.encode_for(ti, await raw_bytes())
            for _attempt in range(2):
                try:
                    alloc = await self.s.mover.allocate_with_room(
                        ti, key, nbytes if payload is None else payload.nbytes, tag
                    )
                except BlockExistsError:
                    if not await t.backend.contains(key):
                        return None  # only reserved: another task is writing it right now
                    if not tag_checked(tag):
                        tag = checked_tag(tag, await raw_bytes())
                    if await self.verify_copy(ti, key, nbytes, tag):
                        return ti, tag  # committed earlier (e.g. a write-through copy): adopt it
                    if self.s.index.entries.get(key) is not None:
                        return None  # indexed meanwhile by another task: theirs now
                    await self.s.drop_copy(ti, key)  # corrupt or truncated: replace it
                    continue
                except CapacityError as exc:
                    last_exc = exc
                    break
                except BackendError as exc:
                    self.s.tier_failed(ti, exc)
                    last_exc = exc
                    break
                try:
                    if device_io:
                        src = await anyio.to_thread.run_sync(contiguous_bytes, data)
                        await cast("SupportsDeviceIO", t.backend).write_device(alloc, src)
                    elif payload is None:
                        await cast("SupportsArrayIO", t.backend).write_arrays([alloc], [data])
                    else:
                        await t.backend.write(alloc, payload)
                except BlockNotFoundError:
                    return None  # the reservation was dropped by a concurrent evict of the key
                except BackendError as exc:
                    self.s.tier_failed(ti, exc)
                    last_exc = exc
                    break
                t.bytes_in += nbytes
                self.s.tel.bytes_written.add(nbytes, {"tier": t.name})
                return ti, tag
        if last_exc is None:
            raise CapacityError(f"no tier has room for a block of {nbytes} bytes")
        if isinstance(last_exc, CapacityError):
            raise CapacityError(f"no tier has room for a block of {nbytes} bytes ({last_exc})") from last_exc
        raise last_exc

    async def verify_copy(self, ti: int, key: str, nbytes: int, tag: bytes) -> bool:
        """Whether tier ``ti``'s committed copy of ``key`` reads back whole and, for an exact
        copy, matches the checksum ``tag`` carries (a lossy tier's copy is checked by its
        codec's own checksum). ``tag`` must carry one (:func:`checked_tag`)."""
        try:
            raw = await self.s.read_raw(ti, key)
        except (BlockNotFoundError, IntegrityError):
            return False
        if len(raw) != nbytes:
            return False
        return not self.s.exact_tier(ti) or tag_checksum(tag, raw) == tag_crc(tag)

    async def attach_copy(self, e: Entry, ti: int) -> None:
        """Account for a copy of ``e`` just committed on tier ``ti``: every byte a tier holds is
        either indexed or freed. The copy is kept when it is one of ``e``'s copies already
        (serving or durable) or can become its missing durable copy (a healthy persistent
        tier below the serving one); otherwise (``e`` left the index meanwhile, or already
        has a durable copy elsewhere) it is evicted at once."""
        if self.s.index.entries.get(e.key) is e:
            if ti in (e.tier, e.backing):
                return
            if e.backing < 0 and ti > e.tier and self.s.tiers[ti].backend.capabilities.persistent:
                self.s.index.set_backing(e, ti)
                return
        await self.s.drop_copy(ti, e.key)

    async def recover(self) -> None:
        """Rebuild the index from persistent tiers: the fastest copy serves, the
        next persistent copy is the durable backing; further copies are removed."""
        for ti, t in enumerate(self.s.tiers):
            if not isinstance(t.backend, SupportsScan):
                continue
            for info in await t.backend.scan():
                parsed = unpack_tag(info.tag)
                if parsed is None:
                    # not a tierkv block (a checkpoint manifest, another user's object): kept, accounted
                    self.s.manifests.setdefault(ti, {})[info.key] = info.nbytes
                    continue
                ms, tenant, parent, pos, crc, nbytes, root = parsed
                if nbytes != info.nbytes and t.codec is None:
                    await self.s.drop_copy(ti, info.key)  # truncated or foreign: never served, freed
                    continue
                e = self.s.index.entries.get(info.key)
                if e is None:
                    e = Entry(info.key, ti, nbytes, info.tag, ms, tenant, parent, pos, crc)
                    e.exact = tag_exact(info.tag)
                    e.backing = ti
                    self.s.index.adopt(e, root)
                    t.place(e)
                elif e.backing == e.tier:
                    self.s.index.set_backing(e, ti)
                else:
                    await t.backend.evict(info.key)
