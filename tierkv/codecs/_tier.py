"""``TierCodec``: the small, stable per-tier codec API the core uses.

Usage::

    from tierkv.codecs import TierCodec

    tc = TierCodec.from_config({"codec": "auto"}, bandwidth_Bps=0.5e9)  # or None -> raw, or {"codec": "lz4"}
    block = tc.encode(kv_fp16)            # bytes: a self-describing block (header names codec and params)
    kv = tc.decode(block)                 # np.ndarray, same shape/dtype (lossy codecs: approximately)
    kv = await tc.adecode(block)          # in a worker thread behind the tier's CapacityLimiter
    tc.name, tc.lossless, tc.ratio_estimate, tc.decode_Bps, tc.reasoning

Config (a tier's ``codec`` table, or ``None``):

* ``None`` / ``{}``: ``raw`` when no bandwidth is given; with ``bandwidth_Bps`` the
  same as ``{"codec": "auto"}``.
* ``{"codec": "auto", "allow_lossy": true, "max_level": 2, "threads": 2}``: choose
  (lossy levels up to ``max_level``, default :data:`DEFAULT_LEVEL`, the highest level
  that meets the quality goals) among the measured candidates (:data:`~tierkv.codecs._choice.MEASURED_CANDIDATES`,
  from ``tierkv codec-eval`` on SmolLM2-135M) the one of least fetch + decode time
  at ``bandwidth_Bps`` with ``threads`` decoding threads.
* ``{"codec": NAME, ...params}``: that registered codec (``raw``, ``lz4``, ``zstd``,
  ``cachegen`` with ``level``, ``entropy``, ...), no choice.

Errors: ``from_config`` raises :class:`~tierkv.ConfigError` (bad field) and the
registry's plugin errors; ``encode`` raises :class:`~tierkv.CodecError` /
:class:`~tierkv.InputError`; ``decode`` raises :class:`~tierkv.DecodeError` for a
corrupted, truncated or foreign block (never returns garbage). Any block
decodes, whatever codec wrote it. Concurrency: thread-safe; the async methods
run in worker threads, at most ``threads`` at a time (anyio limiter, asyncio and
trio). Cancellation: a cancelled ``aencode``/``adecode`` returns at once; the
pure worker computation finishes and its result is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import ConfigError
from ._cachegen import DEFAULT_LEVEL
from ._choice import MEASURED_CANDIDATES, CodecCandidate
from ._pipeline import CodecPipeline

__all__ = ["TierCodec"]


class TierCodec:
    """One tier's codec: blocking and async encode/decode plus the reasoning behind the choice."""

    __slots__ = ("_candidate", "_pipeline")

    def __init__(self, pipeline: CodecPipeline, candidate: CodecCandidate | None) -> None:
        self._pipeline = pipeline
        self._candidate = candidate

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | None,
        *,
        bandwidth_Bps: float | None = None,
        tier: str = "",
        candidates: Sequence[CodecCandidate] | None = None,
    ) -> TierCodec:
        """Build the codec of a tier (see the module docstring); ``bandwidth_Bps`` in bytes/s."""
        cfg = dict(config or {})
        if not cfg and bandwidth_Bps is not None:
            cfg = {"codec": "auto"}
        if bandwidth_Bps is not None and not (bandwidth_Bps > 0 and math.isfinite(bandwidth_Bps)):
            raise ConfigError(f"tiers.{tier}.bandwidth" if tier else "bandwidth", bandwidth_Bps, "a positive number")
        if cfg.get("codec") == "auto" and "max_level" not in cfg:
            cfg["max_level"] = DEFAULT_LEVEL  # lossier levels only when the config allows them
        cands = tuple(candidates) if candidates is not None else MEASURED_CANDIDATES
        pipeline = CodecPipeline.from_config(cfg, tier=tier, bandwidth=bandwidth_Bps, candidates=cands)
        if pipeline.choice is not None:
            return cls(pipeline, pipeline.choice.chosen)
        codec = pipeline.codec
        level = getattr(codec, "level", 0) or 0
        entropy = getattr(codec, "entropy", None)
        match = next(
            (
                c
                for c in cands
                if c.codec == codec.name and (not c.lossy or (c.level == level and c.params.get("entropy") == entropy))
            ),
            None,
        )
        return cls(pipeline, match)

    # -- description

    @property
    def name(self) -> str:
        """Registry name of the codec (``raw``, ``lz4``, ``zstd``, ``cachegen``, ...)."""
        return self._pipeline.codec.name

    @property
    def params(self) -> Mapping[str, Any]:
        return dict(self._pipeline.codec.params)

    @property
    def lossless(self) -> bool:
        return not self._pipeline.codec.lossy

    @property
    def threads(self) -> int:
        return self._pipeline.threads

    @property
    def ratio_estimate(self) -> float:
        """fp16 bytes / stored bytes: measured ratio of this configuration (1.0 when unknown)."""
        return self._candidate.ratio if self._candidate is not None else 1.0

    @property
    def decode_Bps(self) -> float:
        """Measured decode rate, bytes of fp16 per second on one core (codec's estimate when unmeasured)."""
        rate = self._candidate.decode_mbps if self._candidate is not None else self._pipeline.codec.decode_mbps
        return rate * 1e6

    @property
    def reasoning(self) -> dict[str, Any]:
        """Why this codec: the choice (costs, break-even bandwidths) or that it was configured explicitly."""
        if self._pipeline.choice is not None:
            return self._pipeline.choice.as_dict()
        return {"codec": self.name, "params": self.params, "reason": "configured explicitly"}

    def stats(self) -> dict[str, Any]:
        """Counters and reasoning (no I/O)."""
        return self._pipeline.stats()

    # -- coding

    def encode(self, array: np.ndarray[Any, Any], *, dtype: str | None = None) -> bytes:
        """Encode into a self-describing block (blocking, CPU-bound)."""
        return self._pipeline.encode(array, dtype=dtype)

    def decode(self, payload: bytes | bytearray | memoryview) -> np.ndarray[Any, Any]:
        """Decode any tierkv block (blocking); raises DecodeError for a bad one."""
        return self._pipeline.decode(payload)

    def decode_many(self, payloads: Sequence[bytes | bytearray | memoryview]) -> list[np.ndarray[Any, Any]]:
        """Decode several blocks with up to ``threads`` threads (zstd and numpy release the GIL)."""
        if self.threads <= 1 or len(payloads) <= 1:
            return [self.decode(p) for p in payloads]
        with ThreadPoolExecutor(min(self.threads, len(payloads))) as pool:
            return list(pool.map(self.decode, payloads))

    async def aencode(self, array: np.ndarray[Any, Any], *, dtype: str | None = None) -> bytes:
        """:meth:`encode` in a worker thread (at most ``threads`` at a time)."""
        return await self._pipeline.aencode(array, dtype=dtype)

    async def adecode(self, payload: bytes | bytearray | memoryview) -> np.ndarray[Any, Any]:
        """:meth:`decode` in a worker thread (at most ``threads`` at a time)."""
        return await self._pipeline.adecode(payload)

    def __repr__(self) -> str:
        return f"TierCodec({self.name}, {self.params!r}, ratio~{self.ratio_estimate:.2f})"
