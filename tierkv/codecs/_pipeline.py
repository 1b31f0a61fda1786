"""Per-tier codec pipelines and the async wrappers that keep coding off the event loop.

A tier's config names its codec (``{"codec": "lz4"}``,
``{"codec": "cachegen", "level": 2, "entropy": "zstd"}``, or ``{"codec": "auto", ...}``
for a choice by bandwidth); :meth:`CodecPipeline.from_config` builds it. Encoding
and decoding run in worker threads through ``anyio.to_thread.run_sync`` with a
:class:`anyio.CapacityLimiter` (one per pipeline unless one is passed), so the
event loop never blocks; works under asyncio and trio.

Cancellation: a cancelled ``aencode``/``adecode`` returns control at once; the
worker thread finishes its (pure) computation and its result is dropped, so
nothing is left half-done. Concurrency: any number of tasks may call a
pipeline concurrently; at most ``threads`` code blocks at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from .._options import opt_float, opt_int
from ..errors import ConfigError
from ._base import Codec
from ._choice import CodecCandidate, CodecChoice, choose_codec
from ._format import decode_block, encode_block
from ._registry import codec_from_params

__all__ = ["CodecPipeline", "adecode_block", "aencode_block"]


async def aencode_block(
    array: np.ndarray[Any, Any], codec: Codec, *, dtype: str | None = None, limiter: anyio.CapacityLimiter | None = None
) -> bytes:
    """:func:`encode_block` in a worker thread (``limiter`` bounds concurrency; default: anyio's)."""
    return await anyio.to_thread.run_sync(lambda: encode_block(array, codec, dtype=dtype), limiter=limiter)


async def adecode_block(
    block: bytes | bytearray | memoryview, *, limiter: anyio.CapacityLimiter | None = None
) -> np.ndarray[Any, Any]:
    """:func:`decode_block` in a worker thread; raises :class:`~tierkv.DecodeError` like it."""
    return await anyio.to_thread.run_sync(lambda: decode_block(block), limiter=limiter)


class CodecPipeline:
    """The codec of one tier plus counters for ``stats()``.

    ``choice`` holds the reasoning when the codec was picked by bandwidth.
    Thread-safe counters; the limiter is created on first async use (inside
    the running event loop).
    """

    def __init__(self, codec: Codec, *, tier: str = "", threads: int = 1, choice: CodecChoice | None = None) -> None:
        self.codec = codec
        self.tier = tier
        self.threads = threads
        self.choice = choice
        self._limiter: anyio.CapacityLimiter | None = None
        self._lock = threading.Lock()
        self._counts = {"encoded_blocks": 0, "decoded_blocks": 0, "raw_bytes": 0, "encoded_bytes": 0}

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | None,
        *,
        tier: str = "",
        bandwidth: float | None = None,
        candidates: Sequence[CodecCandidate] = (),
    ) -> CodecPipeline:
        """Build a pipeline from a tier's ``codec`` table.

        ``None`` or ``{}`` means ``raw``. ``codec = "auto"`` chooses among
        ``candidates`` by ``bandwidth`` (bytes/s; or the table's ``bandwidth``)
        with the table's ``allow_lossy`` / ``max_level`` / ``threads``. Any other
        name is looked up in the ``tierkv.codecs`` registry and gets the rest
        of the table as params (``threads`` excepted). Raises ConfigError and
        the registry's PluginError subclasses.
        """
        prefix = f"tiers.{tier}.codec" if tier else "codec"
        cfg = dict(config or {})
        name = cfg.pop("codec", "raw")
        if not isinstance(name, str) or not name:
            raise ConfigError(prefix + ".codec", name, "a codec name or 'auto'")
        threads = opt_int(cfg, "threads", 1, prefix=prefix, minimum=1, maximum=256)
        cfg.pop("threads", None)
        if name != "auto":
            return cls(codec_from_params(name, cfg), tier=tier, threads=threads)
        bw = bandwidth if bandwidth is not None else opt_float(cfg, "bandwidth", None, prefix=prefix, minimum=1.0)
        allow_lossy = cfg.get("allow_lossy", True)
        max_level = cfg.get("max_level")
        if not isinstance(allow_lossy, bool):
            raise ConfigError(prefix + ".allow_lossy", allow_lossy, "true or false")
        if max_level is not None and (isinstance(max_level, bool) or not isinstance(max_level, int)):
            raise ConfigError(prefix + ".max_level", max_level, "an int level")
        if not candidates:
            raise ConfigError(prefix + ".codec", "auto", "'auto' needs measured candidates (run tierkv codec-eval)")
        choice = choose_codec(candidates, bw, parallelism=threads, allow_lossy=allow_lossy, max_level=max_level)
        codec = codec_from_params(choice.chosen.codec, choice.chosen.params)
        return cls(codec, tier=tier, threads=threads, choice=choice)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                self._counts[k] += v

    def encode(self, array: np.ndarray[Any, Any], *, dtype: str | None = None) -> bytes:
        """Blocking encode into a self-describing block (see :func:`encode_block`)."""
        block = encode_block(array, self.codec, dtype=dtype)
        self._count(encoded_blocks=1, raw_bytes=array.nbytes, encoded_bytes=len(block))
        return block

    def decode(self, block: bytes | bytearray | memoryview) -> np.ndarray[Any, Any]:
        """Blocking decode (any codec's block decodes: the header names it)."""
        out = decode_block(block)
        self._count(decoded_blocks=1)
        return out

    def _get_limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.threads)
        return self._limiter

    async def aencode(self, array: np.ndarray[Any, Any], *, dtype: str | None = None) -> bytes:
        """:meth:`encode` in a worker thread, at most ``threads`` at a time."""
        return await anyio.to_thread.run_sync(lambda: self.encode(array, dtype=dtype), limiter=self._get_limiter())

    async def adecode(self, block: bytes | bytearray | memoryview) -> np.ndarray[Any, Any]:
        """:meth:`decode` in a worker thread, at most ``threads`` at a time."""
        return await anyio.to_thread.run_sync(lambda: self.decode(block), limiter=self._get_limiter())

    def stats(self) -> dict[str, Any]:
        """Counters, the codec and, when chosen by bandwidth, the reasoning. No I/O."""
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
        out["codec"] = self.codec.name
        out["params"] = dict(self.codec.params)
        out["ratio"] = out["raw_bytes"] / out["encoded_bytes"] if out["encoded_bytes"] else None
        if self.choice is not None:
            out["choice"] = self.choice.as_dict()
        return out
