"""Cache policies of the trace-replay lab, one per module; each implements :class:`~tierkv.lab.policies.base.Policy`.

Classical baselines touch blocks in request order, as a serving engine does:

* ``lru`` (:mod:`.lru`) -- least recently used.
* ``lfu`` (:mod:`.lfu`) -- least frequently used (frequency while resident), ties broken by recency.
* ``arc`` (:mod:`.arc`) -- Adaptive Replacement Cache (Megiddo & Modha, FAST'03).
* ``s3fifo`` (:mod:`.s3fifo`) -- S3-FIFO (Yang et al., SOSP'23); ``s3fifo-2`` moves an object to the main
  FIFO after two accesses in the small one, not one.
* ``tinylfu`` (:mod:`.tinylfu`) -- W-TinyLFU (Einziger et al., 2017); ``tinylfu-reset`` restarts the count
  of accesses from zero at each halving of the frequencies (as ristretto), not from half.
* ``belady`` (:mod:`.belady`) -- Belady's MIN with bypass (offline upper bound for block hits).

tierkv's own:

* ``tierkv`` (:mod:`.tierkv`) -- :class:`TierKVPolicy`, driven by the library's
  :class:`~tierkv.scheduler.ReusePredictor`, and its ablations (:class:`TierKVOptions`).
* ``lab-tierkv-session`` (:mod:`.session`) -- the renewal-process :class:`SessionPolicy` (the class the library runs as its session shadow).
"""

from .arc import ArcPolicy
from .base import Policy
from .belady import BeladyPolicy, next_use_index
from .lfu import LfuPolicy
from .lru import LruPolicy
from .s3fifo import S3FifoPolicy
from .session import SessionOptions, SessionPolicy, session_class
from .tierkv import OptGen, TierKVOptions, TierKVPolicy
from .tinylfu import TinyLfuPolicy

__all__ = [
    "ArcPolicy",
    "BeladyPolicy",
    "LfuPolicy",
    "LruPolicy",
    "OptGen",
    "Policy",
    "S3FifoPolicy",
    "SessionOptions",
    "SessionPolicy",
    "TierKVOptions",
    "TierKVPolicy",
    "TinyLfuPolicy",
    "next_use_index",
    "session_class",
]
