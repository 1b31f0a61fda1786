"""ARC (adaptive replacement cache, Megiddo and Modha, FAST 2003) for the adaptive policy (pure, no I/O).

ARC splits a cache of ``c`` blocks in two LRU lists: *recent* (T1: blocks one request has used since they
were stored) and *frequent* (T2: used by two or more, or stored again while ARC remembered them). It
remembers the ids of blocks it evicted in two *ghost* lists (B1 from the recent list, B2 from the frequent
one) and adapts ``p``, the recent list's target size: a miss that hits B1 means the recent list was too
small (``p`` grows by ``max(|B2| / |B1|, 1)``), one that hits B2 means the frequent list was (``p``
shrinks by ``max(|B1| / |B2|, 1)``). A victim comes from the recent list while it holds more than ``p``
blocks, else from the frequent one. ARC holds against scans and loops (one-shot blocks stay in the recent
list) and follows recency where that is right, without a parameter to tune.

:class:`ArcTarget` is the part the real cache and the shadow have in common (each its own instance): ``p``
and the ghost lists (ids only, ``|T1| + |B1| <= c`` and ``|B1| + |B2| <= c``, ARC's bounds). The library keeps the two lists of resident
blocks itself (per tier, ``Tier.arc``: intrusive lists through the index's columns) and asks
:meth:`ArcTarget.evict_recent` which to take a victim from. :class:`ArcShadow` is a whole ARC of sampled
block ids, served request by request as the library's put serves one
(:class:`~tierkv.scheduler.TauAdapter` compares its hits with the other shadows').

Owns: ARC's adaptation and ghosts, and the sampled ARC. Not thread-safe (one event loop, or the replay's
thread). Raises ConfigError for a bad capacity; the methods never raise for ints.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ._admission import positive_int

__all__ = ["ArcShadow", "ArcTarget"]


class ArcTarget:
    """ARC's target size ``p`` of the recent list and its ghost lists, for a cache of ``capacity_blocks``."""

    __slots__ = ("_b1", "_b2", "_c", "p")

    def __init__(self, capacity_blocks: int) -> None:
        self._c = positive_int("capacity_blocks", capacity_blocks)
        self.p = 0.0
        self._b1: OrderedDict[int, None] = OrderedDict()
        self._b2: OrderedDict[int, None] = OrderedDict()

    @property
    def capacity(self) -> int:
        return self._c

    def resize(self, capacity_blocks: int) -> None:
        """A new capacity: ``p`` is clipped to it, the ghosts are trimmed to it."""
        self._c = positive_int("capacity_blocks", capacity_blocks)
        self.p = min(self.p, float(self._c))
        self._trim(0)

    def ghosts(self) -> tuple[int, int]:
        """(|B1|, |B2|)."""
        return len(self._b1), len(self._b2)

    def returning(self, block: int) -> bool:
        """``block`` missed and is about to be stored: True if ARC remembered it (it goes to the frequent
        list; ``p`` adapts toward the list it was evicted from), else False (the recent list)."""
        b1, b2 = self._b1, self._b2
        if block in b1:
            self.p = min(float(self._c), self.p + max(len(b2) / len(b1), 1.0))
            del b1[block]
            return True
        if block in b2:
            self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
            del b2[block]
            return True
        return False

    def evict_recent(self, recent: int) -> bool:
        """Whether the next victim comes from the recent list, which holds ``recent`` blocks."""
        return recent > 0 and recent > self.p

    def lost(self, block: int, frequent: bool, recent: int) -> None:
        """``block`` left the cache to make room for a new one (from the frequent list if ``frequent``);
        ``recent``: the recent list's size after it left. Its id is remembered in the matching ghost
        list, within ARC's bounds counted with the block to come in the recent list (so a victim of a
        recent list that held the whole cache is not remembered: ARC's case IV(a))."""
        g = self._b2 if frequent else self._b1
        g[block] = None
        g.move_to_end(block)
        self._trim(recent + 1)

    def _trim(self, recent: int) -> None:
        b1, b2, c = self._b1, self._b2, self._c
        while b1 and len(b1) > max(0, c - recent):
            b1.popitem(last=False)
        while b2 and len(b1) + len(b2) > c:
            b2.popitem(last=False)


class ArcShadow:
    """A whole ARC of ``capacity_blocks`` over (sampled) block ids, served a request at a time."""

    __slots__ = ("_t1", "_t2", "cap", "target")

    def __init__(self, capacity_blocks: int) -> None:
        self.cap = positive_int("capacity_blocks", capacity_blocks)
        self.target = ArcTarget(self.cap)
        self._t1: OrderedDict[int, None] = OrderedDict()
        self._t2: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, block: object) -> bool:
        return block in self._t1 or block in self._t2

    def sizes(self) -> tuple[int, int]:
        """(|T1|, |T2|)."""
        return len(self._t1), len(self._t2)

    def request(self, blocks: Sequence[int]) -> int:
        """Serve one request's blocks (root first) as the library does: the held ones are used (a block
        of the recent list joins the frequent one), then the missing ones are stored root first, each
        making room first when the cache is full, until the victim would be one of the request's own
        new blocks (the recent list over its target holds only them): then the rest is not stored, as
        the library's put stops there (``Mover.pick_victims``) instead of evicting its own first blocks
        (which would leave its later ones unreachable). Returns how many were held."""
        t1, t2 = self._t1, self._t2
        held = 0
        missing = []
        for b in blocks:
            if b in t2:
                t2.move_to_end(b)
                held += 1
            elif b in t1:
                del t1[b]
                t2[b] = None
                held += 1
            else:
                missing.append(b)
        own: set[int] = set()
        for b in missing:
            if b in t1 or b in t2:
                continue  # (a repeated block of this request, stored just now)
            if len(t1) + len(t2) >= self.cap and t1 and next(iter(t1)) in own and self.target.evict_recent(len(t1)):
                break  # the victim would be this request's own: it stops, as the library's put does
            frequent = self.target.returning(b)
            if len(t1) + len(t2) >= self.cap:
                self._replace()
            (t2 if frequent else t1)[b] = None
            own.add(b)
        return held

    def _replace(self) -> None:
        t1, t2 = self._t1, self._t2
        if t1 and (self.target.evict_recent(len(t1)) or not t2):
            v, _ = t1.popitem(last=False)
            self.target.lost(v, False, len(t1))
        elif t2:
            v, _ = t2.popitem(last=False)
            self.target.lost(v, True, len(t1))
