"""The renewal-process (session) cache: :class:`SessionPolicy`, its options and its period classes.

Each conversation is a renewal process: per class (turn x previous gap, or prompt length on a first turn) an
online Kaplan-Meier survival of the time to the next turn (:class:`~tierkv.scheduler.RenewalHazard`),
scored by hit density. Pure (no I/O, no clock of its own): one object is both the lab's
``lab-tierkv-session`` policy and the adaptive policy's *session shadow* inside the library
(:class:`~tierkv._scheduling.SchedulerState`), a whole (unsampled) simulation of the cache at its real
capacity that the library follows in the session mode (``TauAdapter.session_mode``): with ``track`` on it
records the blocks it dropped or declined (:attr:`SessionPolicy.dropped`), which the library evicts first.

Owns: session identification, the period classes, the hit-density ranking and the simulated resident set.
Memory is bounded by the capacity (:meth:`SessionPolicy._bound`): what it remembers of blocks it no longer
holds (their last session, their fanout) and of sessions without blocks is forgotten oldest first.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import islice

from ..errors import ConfigError
from ._survival import RenewalHazard

__all__ = ["SessionOptions", "SessionPolicy", "session_class"]


_N_TURN_BUCKETS = 4
_N_LEN_BUCKETS = 4
_CLS_TAIL = _N_TURN_BUCKETS * _N_LEN_BUCKETS
_CLS_LEFTOVER = _CLS_TAIL + 1
_SESSION_GROUPS: tuple[int, ...] = (*([0] * _CLS_TAIL), 1, 2)


def session_class(turn: int, prompt_blocks: int, previous_gap_s: float | None = None) -> int:
    """Class in ``[0, 16)`` of a session's period, known when its turn arrives.

    A first turn (``turn <= 1`` or no previous gap): its prompt length in blocks, <= 4, <= 16, <= 64, more
    -> 0..3. A later turn: ``4 + 4 * turn_bucket + gap_bucket`` with turn buckets 2, 3-4, 5+ and buckets of
    the gap that preceded this turn, < 30 s, < 2 min, < 8 min, more (a session's pace persists: users and
    agents have their own rhythm). Classes 16 (a partial tail block) and 17 (blocks a continuation did not
    re-use) are separate.
    """
    if turn <= 1 or previous_gap_s is None:
        return 0 if prompt_blocks <= 4 else 1 if prompt_blocks <= 16 else 2 if prompt_blocks <= 64 else 3
    tb = 0 if turn == 2 else 1 if turn <= 4 else 2
    g = previous_gap_s
    gb = 0 if g < 30.0 else 1 if g < 120.0 else 2 if g < 480.0 else 3
    return 4 + 4 * tb + gb


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """Components of the session (renewal-process) tierkv policy; each flag off is one ablation.

    * ``hazard`` -- rank sessions by the learned hit density (off: by recency of the session's last turn).
    * ``classes`` -- one survival curve per (turn x prompt length) class (off: one for all sessions).
    * ``density`` -- hit density per unit time (off: probability of a turn within the horizon).
    * ``bypass`` -- do not admit blocks of a session that ranks at or below the current victim.
    * ``prefix_tree`` -- evict only leaves of the resident prefix tree (a parent outlives its children),
      deepest block of the victim session first, and never admit a block whose parent is not resident.
    * ``tail`` -- a partial trailing block is its own session (class ``tail``): the next turn extends
      it under a new id, so it is rarely re-used.
    * ``fanout_protect`` -- a block followed by this many distinct blocks is a shared prefix: re-using
      it does not make a request a continuation of whoever touched it last.
    * ``horizon_s`` -- the horizon until the first evictions; then the EWMA of the age of evicted sessions.
    * ``bins_per_octave``, ``prior_strength`` -- survival estimation (:class:`RenewalHazard`).
    * ``refresh_periods`` -- re-estimate the survival curves every this many new periods.
    * ``rescore_fraction`` -- re-rank resident sessions every ``max(1 s, horizon x fraction)``.
    """

    hazard: bool = True
    classes: bool = True
    density: bool = True
    bypass: bool = True
    prefix_tree: bool = True
    tail: bool = True
    fanout_protect: int = 4
    horizon_s: float = 60.0
    bins_per_octave: int = 4
    prior_strength: float = 20.0
    refresh_periods: int = 256
    rescore_fraction: float = 1.0 / 32.0

    def __post_init__(self) -> None:
        for name in ("fanout_protect", "bins_per_octave", "refresh_periods"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (2 if name == "fanout_protect" else 1):
                raise ConfigError(f"tierkv.{name}", v, "an integer >= 2" if name == "fanout_protect" else ">= 1")
        for name in ("horizon_s", "prior_strength", "rescore_fraction"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"tierkv.{name}", v, "a finite number > 0")


class SessionPolicy:
    """tierkv's policy: conversations as renewal processes, ranked by learned hit density.

    A request is a *turn* of a session. It continues the session that last touched the deepest block of its
    leading run of already-seen blocks, unless that block is a shared prefix (``fanout_protect`` distinct
    successors); then it starts a new session (turn 1). Each session's period (time since its last turn)
    is tracked by :class:`~tierkv.scheduler._survival.RenewalHazard` in a class known at the turn (turn number
    x prompt length; a partial tail block and the blocks a continuation left behind have their own classes).
    The score of a session of age ``a`` is the hit density ``D(a)`` over the cache's horizon ``H`` (the EWMA
    age of evicted sessions): the next turn re-uses the whole chain, so every resident block of a session
    earns the same expected hits per block-second. A block belongs to the session that touched it last
    (ancestors therefore belong to sessions at least as recent as their descendants).

    Eviction: the session with the lowest score gives up its deepest resident block that has no resident
    child (leaf of the prefix tree); shared prefixes stay while anything below them is resident. A new block
    is admitted only if its session outranks the victim (bypass). Scores of resident sessions are recomputed
    every ``max(1 s, H x rescore_fraction)`` into a heap; the survival curves every ``refresh_periods``
    periods. Outcomes are only the turns that actually arrived: no future information.

    Block ids are any hashable values (the lab's integers, the library's keys). ``track``: record in
    :attr:`dropped` every block evicted or declined (bypassed), oldest first (bounded: the oldest are
    forgotten past ``2 x capacity + 1024``; a consumer must check that a dropped block is not held again,
    :meth:`holds`). Not thread-safe; never raises for input of the declared types.
    """

    __slots__ = (
        "cache",
        "capacity",
        "deferred",
        "dropped",
        "fanout",
        "heap",
        "horizon",
        "hz",
        "lists",
        "name",
        "next_rescore",
        "next_sid",
        "opts",
        "owned",
        "parent",
        "rc",
        "s_cls",
        "s_pid",
        "s_start",
        "s_turn",
        "s_ver",
        "since_refresh",
        "toucher",
        "track",
    )

    def __init__(
        self,
        capacity: int,
        options: SessionOptions | None = None,
        name: str = "lab-tierkv-session",
        *,
        track: bool = False,
    ) -> None:
        self.name = name
        self.capacity = capacity
        self.opts = o = options or SessionOptions()
        self.hz = RenewalHazard(_SESSION_GROUPS, o.bins_per_octave, 64, 1.0, o.prior_strength)
        self.cache: dict[Hashable, int] = {}  # resident block -> owner session
        self.parent: dict[Hashable, Hashable | None] = {}  # resident block -> parent block (None: root)
        self.rc: dict[Hashable, int] = {}  # resident block -> resident children
        self.deferred: set[Hashable] = set()  # resident blocks skipped because they had resident children
        self.toucher: dict[Hashable, int] = {}  # a request's leaf -> its session (bounded, oldest first)
        self.fanout: dict[Hashable, int] = {}  # block a request extended -> requests that extended it (bounded)
        self.lists: dict[int, list[Hashable]] = {}  # live session -> its blocks, deepest last (stale skipped)
        self.owned: dict[int, int] = {}  # live session -> how many held blocks it owns (gone at 0)
        self.heap: list[tuple[float, float, int, int]] = []  # (score, start, session, version)
        self.s_pid: dict[int, int] = {}
        self.s_cls: dict[int, int] = {}
        self.s_start: dict[int, float] = {}
        self.s_turn: dict[int, int] = {}
        self.s_ver: dict[int, int] = {}
        self.next_sid = 0
        self.horizon = o.horizon_s
        self.next_rescore = -math.inf
        self.since_refresh = 0
        self.track = track
        self.dropped: deque[Hashable] = deque()

    def holds(self, block: Hashable) -> bool:
        """Whether the simulated cache holds ``block``."""
        return block in self.cache

    def _score(self, sid: int, now: float) -> float:
        if not self.opts.hazard:
            return 0.0
        hz = self.hz
        return hz.table[self.s_cls[sid]][hz.bin(now - self.s_start[sid])]

    def _push(self, sid: int, now: float) -> None:
        v = self.s_ver.get(sid, 0) + 1
        self.s_ver[sid] = v
        heapq.heappush(self.heap, (self._score(sid, now), self.s_start[sid], sid, v))

    def _new_session(self, now: float, cls: int, turn: int) -> int:
        sid = self.next_sid
        self.next_sid += 1
        self.s_pid[sid] = self.hz.start(now, cls)
        self.s_cls[sid] = cls
        self.s_start[sid] = now
        self.s_turn[sid] = turn
        self.since_refresh += 1
        return sid

    def _disown(self, sid: int) -> None:
        """One held block of ``sid`` left it (evicted, or now another session's): a session that owns
        none any more is dropped from the ranking (its list and heap entry), so that without evictions
        the sessions ranked stay as many as the held blocks, not the requests."""
        c = self.owned[sid] - 1
        if c:
            self.owned[sid] = c
            return
        del self.owned[sid]
        if self.lists.pop(sid, None) is not None:
            self.s_ver[sid] += 1  # (its heap entry is stale now)

    def _own(self, b: Hashable, sid: int, now: float) -> None:
        lst = self.lists.get(sid)
        if lst is None:
            self.lists[sid] = [b]
            self._push(sid, now)
        else:
            lst.append(b)

    def _rescore(self, now: float) -> None:
        s_start, s_ver, score = self.s_start, self.s_ver, self._score
        heap = []
        for sid in self.lists:
            v = s_ver[sid] + 1
            s_ver[sid] = v
            heap.append((score(sid, now), s_start[sid], sid, v))
        heapq.heapify(heap)
        self.heap = heap
        self.next_rescore = now + max(1.0, self.horizon * self.opts.rescore_fraction)

    def _victim(self) -> tuple[float, float, int, int] | None:
        """The top live session entry whose list ends with an evictable block, or None."""
        heap, lists, cache, rc, s_ver = self.heap, self.lists, self.cache, self.rc, self.s_ver
        tree = self.opts.prefix_tree
        while heap:
            top = heap[0]
            sid = top[2]
            if s_ver.get(sid) != top[3]:
                heapq.heappop(heap)
                continue
            lst = lists[sid]
            while lst:
                b = lst[-1]
                if cache.get(b) != sid:
                    lst.pop()
                    continue
                if tree and rc.get(b, 0) > 0:
                    lst.pop()
                    self.deferred.add(b)
                    continue
                return top
            heapq.heappop(heap)
            del lists[sid]
            s_ver[sid] += 1
        return None

    def _drop(self, b: Hashable) -> None:
        if self.track:
            d = self.dropped
            d.append(b)
            if len(d) > 2 * self.capacity + 1024:
                for _ in range(len(d) // 2):
                    d.popleft()

    def _evict(self, sid: int, now: float) -> None:
        b = self.lists[sid].pop()
        del self.cache[b]
        self._disown(sid)
        self.rc.pop(b, None)
        p = self.parent.pop(b)
        self._drop(b)
        age = now - self.s_start[sid]
        self.horizon = 0.999 * self.horizon + 0.001 * (age if age > 1.0 else 1.0)
        if p is not None and self.opts.prefix_tree and p in self.cache:
            c = self.rc[p] - 1
            self.rc[p] = c
            if c == 0 and p in self.deferred:
                self.deferred.discard(p)
                self._own(p, self.cache[p], now)

    def _bound(self) -> None:
        """Forget the oldest leaves past ``2 x capacity + 16384`` remembered (down to half of that), the
        fanouts of blocks neither held nor remembered, and the sessions nothing refers to any more. A
        request whose blocks are all forgotten starts a new session, as a never-seen one does."""
        limit = 2 * self.capacity + 16384
        toucher = self.toucher
        if len(toucher) <= limit:
            return
        for b in list(islice(toucher, len(toucher) - limit // 2)):
            del toucher[b]
        cache = self.cache
        self.fanout = {b: f for b, f in self.fanout.items() if b in toucher or b in cache}
        live = set(toucher.values())
        live.update(cache.values())
        live.update(self.lists)
        live.update(self.owned)
        gone = [sid for sid in self.s_start if sid not in live]
        for sid in gone:
            del self.s_pid[sid], self.s_cls[sid], self.s_start[sid], self.s_turn[sid]
            self.s_ver.pop(sid, None)
        self.heap = [e for e in self.heap if e[2] in live]
        heapq.heapify(self.heap)

    def request(
        self, ids: Sequence[Hashable], now: float, tail_partial: bool, *, continuation: bool = False
    ) -> tuple[int, int]:
        """One request of the blocks ``ids`` (root first) at ``now``: ``(leading hits, hits)`` of the
        cache as the request found it; the cache then holds what it admits. ``continuation``: the
        request continues the one that last touched its deepest already-seen block (a chunk of the same
        turn): no new turn, no period event, its new blocks join that session; its partial last block
        (``tail_partial``) keeps the tail session it has, or gets a new one (a get that found the tail,
        then the put of the same request: the tail does not draw the request's blocks into its
        session)."""
        cache, toucher, fanout, opts, hz = self.cache, self.toucher, self.fanout, self.opts, self.hz
        n = len(ids)
        tailed = opts.tail and tail_partial and n > 1
        # a continuation joins the session of its deepest whole block seen before
        last = n - 1 if (continuation and tailed) else n
        flags = [b in cache for b in ids]
        lead = 0
        for f in flags:
            if not f:
                break
            lead += 1
        hits = sum(flags)
        if n == 0:
            return 0, 0
        # the deepest block a request touched before: held (its owner: the session that touched it last)
        # or the leaf of an earlier request (remembered, bounded); every block before it was seen too
        seen = 0
        psid = -1
        for j in range(last - 1, -1, -1):
            b = ids[j]
            o = cache.get(b)
            if o is None:
                o = toucher.get(b)
            if o is not None:
                seen, psid = j + 1, o
                break
        turn = 1
        gap: float | None = None
        joined = -1
        if seen:
            kb = ids[seen - 1]
            if continuation and psid in self.s_start:
                joined = psid
            elif fanout.get(kb, 0) < opts.fanout_protect and psid in self.s_start:
                turn = self.s_turn[psid] + 1
                gap = now - self.s_start[psid]
                if hz.event(self.s_pid[psid], now):
                    # what the continuation did not re-use stays with the parent, now a leftover
                    self.s_pid[psid] = hz.start(now, _CLS_LEFTOVER)
                    self.s_cls[psid] = _CLS_LEFTOVER
                    self.s_start[psid] = now
                    self.since_refresh += 1
                    if psid in self.lists:
                        self._push(psid, now)
            if seen < last:
                fanout[kb] = fanout.get(kb, 0) + 1
        if self.since_refresh >= opts.refresh_periods:
            self.since_refresh = 0
            hz.refresh(now, self.horizon, opts.density)
            self.next_rescore = -math.inf
        if now >= self.next_rescore:
            self._rescore(now)
        if joined >= 0:
            sid, tail_sid = joined, -1
            if tailed:
                o = cache.get(ids[-1])
                if o is not None and self.s_cls.get(o) == _CLS_TAIL:
                    tail_sid = o
                else:
                    tail_sid = self._new_session(now, _CLS_TAIL, self.s_turn[joined])
        else:
            cls = session_class(turn, n, gap) if opts.classes else 0
            sid = self._new_session(now, cls, turn)
            tail_sid = self._new_session(now, _CLS_TAIL, turn) if tailed else -1
        my = (self._score(sid, now), self.s_start[sid])
        my_tail = (self._score(tail_sid, now), now) if tail_sid >= 0 else my
        cap, tree, bypass = self.capacity, opts.prefix_tree, opts.bypass
        parent, rc = self.parent, self.rc
        admit = True
        for j in range(n):
            b = ids[j]
            owner = tail_sid if (j == n - 1 and tail_sid >= 0) else sid
            if b in cache:
                old = cache[b]
                if old != owner:
                    cache[b] = owner
                    self.owned[owner] = self.owned.get(owner, 0) + 1
                    self._disown(old)
                self._own(b, owner, now)
                continue
            if not admit:
                self._drop(b)
                continue
            p = ids[j - 1] if j else None
            if tree and j and p not in cache:
                admit = False
                self._drop(b)
                continue
            mine = my_tail if owner == tail_sid else my
            while len(cache) >= cap:
                top = self._victim()
                if top is None or (bypass and mine <= (top[0], top[1])):
                    admit = False
                    break
                self._evict(top[2], now)
            if not admit:
                self._drop(b)
                continue
            cache[b] = owner
            self.owned[owner] = self.owned.get(owner, 0) + 1
            parent[b] = p
            if tree and p is not None and p != b:
                rc[p] = rc.get(p, 0) + 1
            self._own(b, owner, now)
        # remembered (most recent last) after they leave the cache: the leaf and its parent (the leaf
        # may be a partial block, which the next turn extends under another id)
        for j in range(max(0, n - 2), n):
            b = ids[j]
            toucher.pop(b, None)
            toucher[b] = tail_sid if (j == n - 1 and tail_sid >= 0) else sid
        self._bound()
        return lead, hits
