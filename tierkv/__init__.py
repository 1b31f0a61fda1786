"""tierkv: place the KV cache of LLM inference across a memory hierarchy.

Open a store with ``kv = await TierKV.open(config)``; see the README for a
quickstart and ``docs/`` for the tiers and the configuration. This namespace is
the user API: the store, its configuration, the model spec, scopes, the results
and every error (:mod:`tierkv.errors`). Backend authors import
:mod:`tierkv.backend` (the plugin-author API) and :mod:`tierkv.errors`.
"""

from ._config import KV_DTYPES, Config, TenantQuota, TierConfig
from ._engine import CheckpointResult, GetResult, LookupResult, PutResult, TenantStats, TierKV, TierStats
from ._keys import Scope
from ._model import AttentionKind, ModelSpec
from ._paged import LAYOUTS, PagedLayout
from ._sync import SyncTierKV
from .errors import (
    BackendClosedError,
    BackendError,
    BackendIOError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ClosedError,
    CodecError,
    ConfigError,
    DecodeError,
    InputError,
    IntegrityError,
    KVLayoutError,
    LoadFailedError,
    PluginConflictError,
    PluginError,
    PluginNotFoundError,
    PluginUnavailableError,
    PluginValidationError,
    SchedulerError,
    TierKVError,
    TierUnavailableError,
    TokensError,
)

__version__ = "0.1.0"

__all__ = [
    "KV_DTYPES",
    "LAYOUTS",
    "AttentionKind",
    "BackendClosedError",
    "BackendError",
    "BackendIOError",
    "BlockExistsError",
    "BlockNotFoundError",
    "CapacityError",
    "CheckpointResult",
    "ClosedError",
    "CodecError",
    "Config",
    "ConfigError",
    "DecodeError",
    "GetResult",
    "InputError",
    "IntegrityError",
    "KVLayoutError",
    "LoadFailedError",
    "LookupResult",
    "ModelSpec",
    "PagedLayout",
    "PluginConflictError",
    "PluginError",
    "PluginNotFoundError",
    "PluginUnavailableError",
    "PluginValidationError",
    "PutResult",
    "SchedulerError",
    "Scope",
    "SyncTierKV",
    "TenantQuota",
    "TenantStats",
    "TierConfig",
    "TierKV",
    "TierKVError",
    "TierStats",
    "TierUnavailableError",
    "TokensError",
    "__version__",
]

# the exported names say they live here, where users import them from (as httpx does)
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
