"""``tinylfu``: W-TinyLFU (Einziger et al., 2017).

A 1% window LRU, a segmented-LRU main (20% probation), admission by frequency. The frequency "sketch" is an
exact counter dict halved every ``10 x capacity`` accesses (the reset/ageing of TinyLFU without the
count-min approximation). Implementations differ in what the reset does to the count of accesses since the
last one: the paper ("divide it and all other counters by 2") and Caffeine halve it too, so that after the
first reset the counts halve every ``5 x capacity`` accesses (``tinylfu``); others (ristretto, simple
reference implementations) restart it from zero, halving every ``10 x capacity`` (``tinylfu-reset``). Either
can be far ahead of the other: ``tinylfu-reset`` 7.7 points of prefix hit rate above on one trace at 1%
capacity, 8.6 below on another at 10% (``benchmarks/results/2026-12-06-session21.txt``): the lab's best
classical policy is the better of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["TinyLfuPolicy"]


class TinyLfuPolicy:
    """W-TinyLFU: window LRU (1%) -> TinyLFU admission -> SLRU main (probation 20% / protected 80%)."""

    __slots__ = (
        "counts",
        "name",
        "prob",
        "prob_cap",
        "prot",
        "prot_cap",
        "reset_at",
        "restart",
        "seen",
        "win",
        "win_cap",
    )

    def __init__(self, capacity: int, *, restart: bool = False) -> None:
        """``restart``: a reset restarts the count of accesses from zero (``tinylfu-reset``) instead of
        halving it (``tinylfu``)."""
        self.restart = restart
        self.name = "tinylfu-reset" if restart else "tinylfu"
        self.win_cap = max(1, capacity // 100)
        main = capacity - self.win_cap
        self.prot_cap = int(main * 0.8)
        self.prob_cap = main - self.prot_cap
        self.win: OrderedDict[int, None] = OrderedDict()
        self.prob: OrderedDict[int, None] = OrderedDict()
        self.prot: OrderedDict[int, None] = OrderedDict()
        self.counts: dict[int, int] = {}
        self.seen = 0
        self.reset_at = 10 * capacity

    def _count(self, b: int) -> None:
        c = self.counts
        c[b] = c.get(b, 0) + 1
        self.seen += 1
        if self.seen >= self.reset_at:
            self.seen = 0 if self.restart else self.seen // 2
            self.counts = {k: v // 2 for k, v in c.items() if v > 1}

    def _to_main(self, cand: int) -> None:
        prob, prot = self.prob, self.prot
        if self.prob_cap + self.prot_cap == 0:
            return
        if len(prob) + len(prot) < self.prob_cap + self.prot_cap:
            prob[cand] = None
            return
        victim = next(iter(prob)) if prob else next(iter(prot))
        c = self.counts
        if c.get(cand, 0) > c.get(victim, 0):
            if victim in prob:
                del prob[victim]
            else:
                del prot[victim]
            prob[cand] = None

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        win, prob, prot = self.win, self.prob, self.prot
        flags = [(b in win or b in prob or b in prot) for b in ids]
        lead = 0
        for f in flags:
            if not f:
                break
            lead += 1
        for b in ids:
            self._count(b)
            if b in win or b in prob or b in prot:
                if b in win:
                    win.move_to_end(b)
                elif b in prob:
                    del prob[b]
                    prot[b] = None
                    if len(prot) > self.prot_cap:
                        k, _ = prot.popitem(last=False)
                        prob[k] = None
                else:
                    prot.move_to_end(b)
                continue
            win[b] = None
            if len(win) > self.win_cap:
                k, _ = win.popitem(last=False)
                self._to_main(k)
        return lead, sum(flags)
