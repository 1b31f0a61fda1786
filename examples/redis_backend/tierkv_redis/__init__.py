"""tierkv-redis: a remote tier backed by a Redis server (an example third-party backend)."""

from ._backend import RedisBackend

__all__ = ["RedisBackend"]
__version__ = "0.1.0"
