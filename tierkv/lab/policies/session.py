"""``tierkv-session``: the experimental renewal-process policy (:class:`SessionPolicy`) and its ablations.

Each conversation is a renewal process: per class (turn x previous gap, or prompt length on a first turn) an
online Kaplan-Meier survival of the time to the next turn (:class:`~tierkv.scheduler.RenewalHazard`),
scored by hit density. Available in the lab only; the library does not run it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tierkv.errors import ConfigError
from tierkv.scheduler._survival import RenewalHazard

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
    """

    __slots__ = (
        "cache",
        "capacity",
        "deferred",
        "fanout",
        "heap",
        "horizon",
        "hz",
        "lists",
        "name",
        "next_rescore",
        "next_sid",
        "opts",
        "parent",
        "rc",
        "s_cls",
        "s_pid",
        "s_start",
        "s_turn",
        "s_ver",
        "since_refresh",
        "toucher",
    )

    def __init__(self, capacity: int, options: SessionOptions | None = None, name: str = "lab-tierkv-session") -> None:
        self.name = name
        self.capacity = capacity
        self.opts = o = options or SessionOptions()
        self.hz = RenewalHazard(_SESSION_GROUPS, o.bins_per_octave, 64, 1.0, o.prior_strength)
        self.cache: dict[int, int] = {}  # resident block -> owner session
        self.parent: dict[int, int] = {}  # resident block -> parent block (-1: root)
        self.rc: dict[int, int] = {}  # resident block -> resident children
        self.deferred: set[int] = set()  # resident blocks skipped because they had resident children
        self.toucher: dict[int, int] = {}  # every seen block -> session that touched it last
        self.fanout: dict[int, int] = {}  # seen block -> distinct successors
        self.lists: dict[int, list[int]] = {}  # live session -> its blocks, deepest last (stale entries skipped)
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

    def _own(self, b: int, sid: int, now: float) -> None:
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

    def _evict(self, sid: int, now: float) -> None:
        b = self.lists[sid].pop()
        del self.cache[b]
        self.rc.pop(b, None)
        p = self.parent.pop(b)
        age = now - self.s_start[sid]
        self.horizon = 0.999 * self.horizon + 0.001 * (age if age > 1.0 else 1.0)
        if p >= 0 and self.opts.prefix_tree and p in self.cache:
            c = self.rc[p] - 1
            self.rc[p] = c
            if c == 0 and p in self.deferred:
                self.deferred.discard(p)
                self._own(p, self.cache[p], now)

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        cache, toucher, fanout, opts, hz = self.cache, self.toucher, self.fanout, self.opts, self.hz
        n = len(ids)
        flags = [b in cache for b in ids]
        lead = 0
        for f in flags:
            if not f:
                break
            lead += 1
        hits = sum(flags)
        if n == 0:
            return 0, 0
        seen = 0
        for b in ids:
            if b not in toucher:
                break
            seen += 1
        turn = 1
        gap: float | None = None
        if seen:
            kb = ids[seen - 1]
            if fanout.get(kb, 0) < opts.fanout_protect:
                psid = toucher[kb]
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
            if seen < n:
                fanout[kb] = fanout.get(kb, 0) + 1
        if self.since_refresh >= opts.refresh_periods:
            self.since_refresh = 0
            hz.refresh(now, self.horizon, opts.density)
            self.next_rescore = -math.inf
        if now >= self.next_rescore:
            self._rescore(now)
        cls = session_class(turn, n, gap) if opts.classes else 0
        sid = self._new_session(now, cls, turn)
        tail_sid = self._new_session(now, _CLS_TAIL, turn) if (opts.tail and tail_partial and n > 1) else -1
        my = (self._score(sid, now), now)
        my_tail = (self._score(tail_sid, now), now) if tail_sid >= 0 else my
        cap, tree, bypass = self.capacity, opts.prefix_tree, opts.bypass
        parent, rc = self.parent, self.rc
        admit = True
        for j in range(n):
            b = ids[j]
            owner = tail_sid if (j == n - 1 and tail_sid >= 0) else sid
            toucher[b] = owner
            if b in cache:
                cache[b] = owner
                self._own(b, owner, now)
                continue
            if not admit:
                continue
            p = ids[j - 1] if j else -1
            if tree and j and p not in cache:
                admit = False
                continue
            mine = my_tail if owner == tail_sid else my
            while len(cache) >= cap:
                top = self._victim()
                if top is None or (bypass and mine <= (top[0], top[1])):
                    admit = False
                    break
                self._evict(top[2], now)
            if not admit:
                continue
            cache[b] = owner
            parent[b] = p
            if tree and p >= 0 and p != b:
                rc[p] = rc.get(p, 0) + 1
            self._own(b, owner, now)
        return lead, hits
