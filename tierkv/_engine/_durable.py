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
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ..backend import SupportsScan
from ..errors import (
    BackendError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    IntegrityError,
)
from ._index import Entry
from ._tags import ZERO16, tag_exact, tag_tenant, unpack_tag

if TYPE_CHECKING:
    from ._store import Store

log = logging.getLogger("tierkv")

__all__ = ["Durable"]


class Durable:
    """Stores blocks and their durable copies (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s

    async def store_block(
        self,
        key: str,
        data: memoryview,
        tag: bytes,
        pos: int,
        tid: bytes,
        parent: bytes,
        crc: int,
        durable: bool,
        root: bytes,
        label: int | None,
    ) -> bool | None:
        """Write one block and index it. Returns True if written, False if it was
        already stored (only its durable copy was added), None if another task
        holds a reservation for it."""
        e = self.s.index.entries.get(key)
        if e is None:
            ti = await self.write_to_fastest(key, data, tag, 0, crc=crc)
            if ti is None:
                return None
            e = self.s.index.entries.get(key)
            if e is None:
                e = Entry(key, ti, data.nbytes, tag, self.s.model_scope, tid, parent, pos, crc)
                e.label = label
                e.t_last = self.s.sched.now()  # the most recent block, until the put records its access
                if self.s.tiers[ti].backend.capabilities.persistent:
                    e.backing = ti
                self.s.index.adopt(e, root)
                e.rank = self.s.mover.rank_of(e)
                self.s.tiers[ti].place(e)
                written = True
            else:
                # another task indexed it meanwhile (same key, same bytes): our copy on ``ti``
                # is kept only if it is one of that entry's copies or can be its durable copy
                await self.attach_copy(e, ti)
                written = False
        else:
            written = False
        if durable and e.backing < 0:
            await self.make_durable(e, data, tag)
        return written

    async def await_concurrent_store(
        self, key: str, store: Callable[[], Awaitable[bool | None]], data: memoryview, tag: bytes, durable: bool
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

    async def make_durable(self, e: Entry, data: memoryview, tag: bytes) -> None:
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
                        placed = await self.write_to_fastest(key, data, tag, bi, only=True, crc=e.crc)
                    except CapacityError:
                        continue
                    if placed is None:
                        busy = True  # another put of the same block is writing it there
                        continue
                    await self.attach_copy(e, bi)
                    break
                if e.backing >= 0 and self.s.index.entries.get(key) is e:
                    return
                if self.s.index.entries.get(key) is not e:
                    # dropped meanwhile by capacity pressure: index it again, durably this time
                    ti = await self.write_to_fastest(key, data, tag, 0, crc=e.crc)
                    if ti is not None:
                        cur = self.s.index.entries.get(key)
                        if cur is None:
                            e.tier, e.backing, e.pins, e.moving = ti, -1, 0, False
                            if self.s.tiers[ti].backend.capabilities.persistent:
                                e.backing = ti
                            self.s.index.adopt(e, b"")
                            self.s.tiers[ti].place(e)
                        else:
                            await self.attach_copy(cur, ti)
                        e = self.s.index.entries.get(key, e)
                    continue
                if not busy:
                    raise CapacityError(f"put(durable=True): no persistent tier has room for block {key[:16]}")
                await anyio.sleep(0.005)

    async def write_to_fastest(
        self, key: str, data: memoryview, tag: bytes, start: int, *, only: bool = False, crc: int | None = None
    ) -> int | None:
        """Write to the fastest healthy tier at or below ``start`` with room (only
        ``start`` with ``only``); None if a reservation for ``key`` exists elsewhere.

        New blocks are the most recently used, so when a tier is full (or too
        fragmented) its lowest-ranked blocks move down first; the space made is
        reserved for this write (:meth:`_allocate_with_room`). A copy the tier
        already holds under ``key`` is adopted only after it verifies against
        ``crc`` (the raw bytes' checksum); otherwise it is replaced.
        """
        last_exc: BaseException | None = None
        tid = tag_tenant(tag) or ZERO16
        for ti in [start] if only else range(start, len(self.s.tiers)):
            t = self.s.tiers[ti]
            if not t.healthy:
                continue
            if not await self.s.quotas.quota_room(tid, ti, data.nbytes):
                last_exc = CapacityError(
                    f"tenant {self.s.tenant_label(tid)!r} is at its quota on tier {t.name!r} "
                    "and has no block of its own left to evict"
                )
                continue
            payload = await self.s.encode_for(ti, data)
            for _attempt in range(2):
                try:
                    alloc = await self.s.mover.allocate_with_room(ti, key, payload.nbytes, tag)
                except BlockExistsError:
                    if not await t.backend.contains(key):
                        return None  # only reserved: another task is writing it right now
                    if await self.verify_copy(ti, key, data.nbytes, crc):
                        return ti  # committed earlier (e.g. a write-through copy): adopt it
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
                    await t.backend.write(alloc, payload)
                except BlockNotFoundError:
                    return None  # the reservation was dropped by a concurrent evict of the key
                except BackendError as exc:
                    self.s.tier_failed(ti, exc)
                    last_exc = exc
                    break
                t.bytes_in += data.nbytes
                self.s.tel.bytes_written.add(data.nbytes, {"tier": t.name})
                return ti
        if last_exc is None:
            raise CapacityError(f"no tier has room for a block of {data.nbytes} bytes")
        if isinstance(last_exc, CapacityError):
            raise CapacityError(f"no tier has room for a block of {data.nbytes} bytes ({last_exc})") from last_exc
        raise last_exc

    async def verify_copy(self, ti: int, key: str, nbytes: int, crc: int | None) -> bool:
        """Whether tier ``ti``'s committed copy of ``key`` reads back whole and, for an exact
        copy, matches ``crc`` (a lossy tier's copy is checked by its codec's own checksum)."""
        if crc is None:
            return True
        try:
            raw = await self.s.read_raw(ti, key)
        except (BlockNotFoundError, IntegrityError):
            return False
        if len(raw) != nbytes:
            return False
        return not self.s.exact_tier(ti) or zlib.crc32(raw) == crc

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
