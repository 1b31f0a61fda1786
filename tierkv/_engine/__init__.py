"""The engine behind :class:`tierkv.TierKV`: a thin front over collaborators.

See docs/architecture.md for the picture; each module's docstring says what it
owns and what it may not touch.
"""

from ._results import CheckpointResult, GetResult, LookupResult, PutResult, TenantStats, TierStats
from ._tierkv import TierKV

__all__ = ["CheckpointResult", "GetResult", "LookupResult", "PutResult", "TenantStats", "TierKV", "TierStats"]
