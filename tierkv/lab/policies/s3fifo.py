"""``s3fifo``: S3-FIFO (Yang et al., SOSP'23): small FIFO (10%), main FIFO with 2-bit frequency, ghost FIFO.

An object leaving the small FIFO moves to the main one when it was accessed again while in it (``s3fifo``);
implementations also use a threshold of two accesses (the paper's pseudo-code reads ``freq > 1``:
``s3fifo-2``). The lab's best classical policy is the better of them."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .base import hits as _hits

__all__ = ["S3FifoPolicy"]


class S3FifoPolicy:
    """S3-FIFO: small FIFO (10%), main FIFO with frequency bits (max 3), ghost FIFO of main's size."""

    __slots__ = ("freq", "ghost", "main", "main_cap", "move_at", "name", "small", "small_cap")

    def __init__(self, capacity: int, *, move_at: int = 1) -> None:
        """``move_at``: the accesses in the small FIFO (after the first) that move an object to the main
        one (1: ``s3fifo``, 2: ``s3fifo-2``)."""
        if isinstance(move_at, bool) or not isinstance(move_at, int) or not 1 <= move_at <= 3:
            raise ValueError(f"move_at must be 1, 2 or 3 (the frequency caps at 3), not {move_at!r}")
        self.move_at = move_at
        self.name = "s3fifo" if move_at == 1 else f"s3fifo-{move_at}"
        self.small_cap = max(1, capacity // 10)
        self.main_cap = capacity - self.small_cap  # 0 only when capacity == 1
        self.small: OrderedDict[int, None] = OrderedDict()
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def _evict_main(self) -> None:
        main, freq = self.main, self.freq
        while main:
            k, _ = main.popitem(last=False)
            f = freq[k]
            if f > 0:
                freq[k] = f - 1
                main[k] = None
            else:
                del freq[k]
                return

    def _evict_small(self) -> None:
        small, freq = self.small, self.freq
        while small:
            k, _ = small.popitem(last=False)
            if freq[k] >= self.move_at and self.main_cap > 0:
                freq[k] = 0
                if len(self.main) >= self.main_cap:
                    self._evict_main()
                self.main[k] = None
            else:
                del freq[k]
                ghost = self.ghost
                ghost[k] = None
                if len(ghost) > max(1, self.main_cap):
                    ghost.popitem(last=False)
                return

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        freq = self.freq
        lead, hits, _flags = _hits(freq, ids)  # type: ignore[arg-type]
        for b in ids:
            if b in freq:
                v = freq[b]
                if v < 3:
                    freq[b] = v + 1
                continue
            if b in self.ghost and self.main_cap > 0:
                del self.ghost[b]
                while len(self.main) >= self.main_cap:
                    self._evict_main()
                self.main[b] = None
            else:
                while len(self.small) >= self.small_cap:
                    self._evict_small()
                self.small[b] = None
            freq[b] = 0
        return lead, hits
