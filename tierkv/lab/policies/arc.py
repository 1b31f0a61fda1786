"""``arc``: Adaptive Replacement Cache (Megiddo & Modha, FAST'03): T1/T2 plus ghost lists B1/B2."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["ArcPolicy"]


class ArcPolicy:
    """Adaptive Replacement Cache."""

    __slots__ = ("b1", "b2", "c", "name", "p", "t1", "t2")

    def __init__(self, capacity: int) -> None:
        self.name = "arc"
        self.c = capacity
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def _replace(self, in_b2: bool) -> None:
        t1, t2 = self.t1, self.t2
        if t1 and (len(t1) > self.p or (in_b2 and len(t1) == self.p)):
            k, _ = t1.popitem(last=False)
            self.b1[k] = None
        elif t2:
            k, _ = t2.popitem(last=False)
            self.b2[k] = None
        else:
            k, _ = t1.popitem(last=False)
            self.b1[k] = None

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        t1, t2, b1, b2, c = self.t1, self.t2, self.b1, self.b2, self.c
        flags = [(b in t1 or b in t2) for b in ids]
        lead = 0
        for f in flags:
            if not f:
                break
            lead += 1
        for b in ids:
            if b in t1 or b in t2:
                if b in t1:
                    del t1[b]
                else:
                    del t2[b]
                t2[b] = None
                continue
            if b in b1:
                self.p = min(float(c), self.p + max(len(b2) / len(b1), 1.0))
                self._replace(False)
                del b1[b]
                t2[b] = None
            elif b in b2:
                self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
                self._replace(True)
                del b2[b]
                t2[b] = None
            else:
                l1 = len(t1) + len(b1)
                if l1 == c:
                    if len(t1) < c:
                        b1.popitem(last=False)
                        self._replace(False)
                    else:
                        t1.popitem(last=False)
                elif l1 < c and l1 + len(t2) + len(b2) >= c:
                    if l1 + len(t2) + len(b2) >= 2 * c:
                        b2.popitem(last=False)
                    if len(t1) + len(t2) >= c:
                        self._replace(False)
                t1[b] = None
        return lead, sum(flags)
