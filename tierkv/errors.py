"""The one place where tierkv's exceptions live: ``tierkv.errors`` (public).

Users catch them from ``tierkv`` (every name below is re-exported there); backend
and codec authors import them from here. Every exception tierkv raises on purpose
is a :class:`TierKVError`. Foreign exceptions (``OSError``, a driver's status
code, a plugin's own errors) are translated at the boundary where they happen and
chained with ``raise ... from exc`` so the original stays visible in the traceback.

The hierarchy::

    TierKVError
    ├── ConfigError                 a configuration field is wrong (names field, value, allowed)
    ├── InputError                  a caller's argument is wrong
    │   ├── TokensError             token ids: wrong type, dtype, empty where not allowed, out of range
    │   └── KVLayoutError           KV tensor: wrong shape, dtype, device or not contiguous
    ├── ClosedError                 the TierKV (or a backend) was closed
    ├── PluginError                 loading a plugin (backend, codec) failed
    │   ├── PluginNotFoundError     no entry point with that name
    │   ├── PluginUnavailableError  found, but unusable here (missing extra or hardware); has ``hint``
    │   ├── PluginConflictError     two distributions claim the same name
    │   └── PluginValidationError   the object behind the entry point breaks the protocol
    ├── BackendError                a tier backend failed; has ``tier``
    │   ├── BlockNotFoundError      no committed block under that key
    │   ├── BlockExistsError        a block (or a reservation) already exists under that key
    │   ├── CapacityError           not enough free capacity for a reservation
    │   ├── BackendClosedError      the backend was closed (also a ClosedError)
    │   ├── IntegrityError          stored bytes failed verification; the block is quarantined
    │   ├── BackendIOError          the medium failed (disk, network, device)
    │   └── TierUnavailableError    the tier is marked unhealthy by the circuit breaker
    ├── CodecError                  encoding failed
    │   └── DecodeError             a payload is corrupted, truncated or of an unknown version
    └── SchedulerError              the scheduler could not complete an operation
        └── LoadFailedError         a fetch failed and the load-failure policy is ``fail``

Catch :class:`TierKVError` to catch everything tierkv raises on purpose.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendClosedError",
    "BackendError",
    "BackendIOError",
    "BlockExistsError",
    "BlockNotFoundError",
    "CapacityError",
    "ClosedError",
    "CodecError",
    "ConfigError",
    "DecodeError",
    "InputError",
    "IntegrityError",
    "KVLayoutError",
    "LoadFailedError",
    "PluginConflictError",
    "PluginError",
    "PluginNotFoundError",
    "PluginUnavailableError",
    "PluginValidationError",
    "SchedulerError",
    "TierKVError",
    "TierUnavailableError",
    "TokensError",
]


class TierKVError(Exception):
    """Root of every exception tierkv raises on purpose."""


class ConfigError(TierKVError, ValueError):
    """A configuration field is invalid.

    The message always names the field (dotted path), the value received and
    what is allowed; the parts are also kept as attributes.
    """

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"config field {field!r}: got {value!r}; allowed: {allowed}")


class InputError(TierKVError, ValueError):
    """An argument given to a public method is invalid."""


class TokensError(InputError):
    """Token ids are of the wrong type or dtype, empty, or out of range."""


class KVLayoutError(InputError):
    """A KV tensor does not match the model spec (shape, dtype, device, contiguity).

    ``expected`` and ``got`` hold the two sides of the mismatch.
    """

    def __init__(self, what: str, expected: Any, got: Any) -> None:
        self.what = what
        self.expected = expected
        self.got = got
        super().__init__(f"KV {what}: expected {expected}, got {got}")


class ClosedError(TierKVError, RuntimeError):
    """The object was closed with ``aclose()`` and can no longer be used."""


class PluginError(TierKVError):
    """A plugin (backend or codec) could not be loaded."""

    def __init__(self, message: str, *, group: str = "", name: str = "") -> None:
        self.group = group
        self.name = name
        super().__init__(message)


class PluginNotFoundError(PluginError, LookupError):
    """No installed distribution provides an entry point of that name."""


class PluginUnavailableError(PluginError):
    """The plugin is installed but cannot run here; ``hint`` says what would fix it."""

    def __init__(self, message: str, *, group: str = "", name: str = "", hint: str = "") -> None:
        self.hint = hint
        super().__init__(message + (f" (hint: {hint})" if hint else ""), group=group, name=name)


class PluginConflictError(PluginError):
    """Two or more distributions register the same plugin name."""


class PluginValidationError(PluginError, TypeError):
    """The object behind an entry point does not satisfy the plugin protocol."""


class BackendError(TierKVError):
    """A tier backend failed. ``tier`` names the tier (empty when unknown)."""

    def __init__(self, message: str, *, tier: str = "") -> None:
        self.tier = tier
        super().__init__(f"[{tier}] {message}" if tier else message)


class BlockNotFoundError(BackendError, KeyError):
    """No committed block exists under the key."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class BlockExistsError(BackendError):
    """A committed block or a pending reservation already exists under the key."""


class CapacityError(BackendError):
    """The reservation does not fit in the free capacity of the tier."""


class BackendClosedError(BackendError, ClosedError):
    """The backend was closed."""


class IntegrityError(BackendError):
    """Stored bytes failed verification (checksum, header, length).

    The block is quarantined: it is never served again.
    """


class BackendIOError(BackendError, OSError):
    """The storage medium or transport failed (disk, network, device)."""


class TierUnavailableError(BackendError):
    """The tier is marked unhealthy by the circuit breaker and is not used."""


class CodecError(TierKVError):
    """Encoding a block failed."""


class DecodeError(CodecError):
    """A payload is corrupted, truncated, or written by an unknown format version."""


class SchedulerError(TierKVError):
    """The scheduler could not complete an operation."""


class LoadFailedError(SchedulerError):
    """A fetch failed and the configured load-failure policy is ``fail``."""
