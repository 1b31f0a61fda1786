"""Checkpoints, restore and flush.

Owns: writing a checkpoint manifest (a delta copy of every indexed block to the
bottom persistent tier), warming the fast tiers from one at open (``restore``), and
reclaiming the blocks of old model scopes (``flush``).

May not touch: the put/get paths.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._keys import Scope
from ..backend import SupportsContentHash
from ..errors import (
    BlockNotFoundError,
    InputError,
    IntegrityError,
    TierUnavailableError,
)
from ._index import Entry
from ._results import CheckpointResult
from ._tags import CKPT_TAG

if TYPE_CHECKING:
    from ._store import Store

log = logging.getLogger("tierkv")

__all__ = ["Checkpoints"]

_CKPT_NAME = re.compile(r"^[0-9A-Za-z._-]{1,100}$")


class Checkpoints:
    """Checkpoints and flush (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s

    async def flush(self, scope: Scope | None = None, *, batch: int = 64) -> int:
        """Reclaim the space of every block of a model scope on every tier,
        persistent ones included; returns the number of blocks removed.

        ``scope`` (its tenant field is ignored) defaults to *every scope except
        this configuration's*: after a rollout (new weights fingerprint, model
        or tokenizer revision, KV dtype) the old keys are already unreachable,
        and ``await kv.flush()`` frees them. Work proceeds in batches of
        ``batch`` blocks with the index lock released in between, so traffic
        continues; run it in the background with
        ``tg.start_soon(kv.flush, old_scope)``. Pinned blocks (being read) are
        skipped and picked up by a later flush.
        """
        self.s.check_open()
        if scope is not None:
            target = scope.with_tenant("").digest()[:16]

            def match(e: Entry) -> bool:
                return e.model_scope[:16] == target
        else:
            current = self.s.model_scope[:16]

            def match(e: Entry) -> bool:
                return e.model_scope[:16] != current

        removed = 0
        while True:
            victims = [e for e in self.s.index.entries.values() if e.pins == 0 and match(e)][:batch]
            if not victims:
                return removed
            for e in victims:
                await self.s.mover.drop(e)
            removed += len(victims)
            await anyio.lowlevel.checkpoint()

    def checkpoint_tier(self) -> int:
        for ti in range(len(self.s.tiers) - 1, -1, -1):
            t = self.s.tiers[ti]
            if t.healthy and t.backend.capabilities.persistent:
                return ti
        raise TierUnavailableError("checkpoints need a healthy persistent tier (e.g. pfs)")

    async def checkpoint(self, name: str) -> CheckpointResult:
        """Write a manifest of the cache state to the bottom persistent tier (PFS).

        Every indexed block gets a copy on that tier if it has none (a *delta*:
        blocks already there — from an earlier checkpoint, a demotion or a
        durable put — are not copied again, and a content-addressed tier stores
        identical content once). The manifest lists the blocks hottest first
        with their content hash, size and tag; it is stored on the same tier
        under ``ckpt.<name>`` and replaces an older checkpoint of that name.
        After it returns, every listed block is durable.

        Raises InputError (bad name), TierUnavailableError, BackendError.
        """
        self.s.check_open()
        if not isinstance(name, str) or not _CKPT_NAME.match(name):
            raise InputError(f"checkpoint name {name!r}: expected 1-100 characters from [0-9A-Za-z._-]")
        ci = self.checkpoint_tier()
        ct = self.s.tiers[ci]
        before = ct.backend.stats().used_bytes
        order: list[Entry] = []
        for t in self.s.tiers:  # hottest first: fastest tier, most recent first
            order.extend(self.s.index.entries[k] for k in reversed(t.lru) if k in self.s.index.entries)
        copied = 0
        rows: list[dict[str, Any]] = []
        with self.s.index.pinned(order):
            for e in order:
                if e.tier != ci and e.backing != ci:
                    try:
                        data = await self.s.read_raw(e.tier, e.key)
                    except (BlockNotFoundError, IntegrityError):
                        continue
                    if await self.s.durable.write_to_fastest(e.key, data, e.tag, ci, only=True) is None:
                        continue
                    copied += e.nbytes
                    if self.s.index.entries.get(e.key) is e and e.backing < 0:
                        self.s.index.set_backing(e, ci)
                    elif ci not in (e.tier, e.backing):
                        # durable elsewhere already: this copy is the manifest's (kept, accounted)
                        self.s.retained.setdefault(ci, set()).add(e.key)
                sha = ""
                if isinstance(ct.backend, SupportsContentHash):
                    sha = await ct.backend.content_hash(e.key) or ""
                rows.append({"key": e.key, "sha256": sha, "nbytes": e.nbytes, "tag": e.tag.hex()})
        manifest = json.dumps(
            {
                "format": "tierkv.checkpoint",
                "version": 1,
                "name": name,
                "created_unix": time.time(),
                "model_scope": self.s.model_scope.hex(),
                "block_tokens": self.s.block_tokens,
                "blocks": rows,
            },
            separators=(",", ":"),
        ).encode()
        key = f"ckpt.{name}"
        with anyio.CancelScope(shield=True):
            await ct.backend.evict(key)
            self.s.manifests.setdefault(ci, {}).pop(key, None)
            alloc = await ct.backend.allocate(key, len(manifest), tag=CKPT_TAG)
            await ct.backend.write(alloc, manifest)
            self.s.manifests[ci][key] = len(manifest)
        logical = sum(int(r["nbytes"]) for r in rows)
        return CheckpointResult(
            name=name,
            tier=ct.name,
            blocks=len(rows),
            logical_bytes=logical,
            copied_bytes=copied,
            stored_bytes_delta=ct.backend.stats().used_bytes - before,
            distinct_contents=len({r["sha256"] for r in rows if r["sha256"]}),
        )

    async def restore(self, name: str) -> int:
        """Warm the fast tiers from checkpoint ``name``: copy its blocks up,
        hottest first, until the fast tiers reach their high watermark."""
        ci = self.checkpoint_tier()
        backend = self.s.tiers[ci].backend
        try:
            raw = await backend.read(f"ckpt.{name}")
        except BlockNotFoundError as exc:
            raise InputError(f"restore: no checkpoint named {name!r} on tier {self.s.tiers[ci].name!r}") from exc
        try:
            manifest = json.loads(bytes(raw))
            rows = manifest["blocks"]
            if manifest.get("format") != "tierkv.checkpoint" or not isinstance(rows, list):
                raise ValueError("not a tierkv checkpoint manifest")
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(
                f"checkpoint {name!r}: unreadable manifest ({exc})", tier=self.s.tiers[ci].name
            ) from exc
        warmed = 0
        for row in rows:
            e = self.s.index.entries.get(str(row.get("key", "")))
            if e is None or e.tier == 0:
                continue
            dst = self.s.mover.warm_target(e.nbytes, e.tier)
            if dst is None:
                break
            if await self.s.mover.promote(e, dst):
                warmed += 1
        return warmed
