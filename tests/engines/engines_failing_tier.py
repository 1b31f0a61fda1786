"""A DRAM tier whose reads fail after its first ``ok_reads`` reads (BackendIOError): the failing tier of the
vLLM connector's failure test, registered as backend ``failing-dram`` through a dist-info directory the test
puts on ``sys.path`` (the way any third-party backend registers: an entry point in ``tierkv.backends``).

Only ``read`` fails; writes, lookups and evictions work, so the store believes it holds the blocks and the
engine plans to load them: the load must then fail over to recomputing, never serve wrong KV, never hang."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tierkv.backend import Allocation, Backend, BackendStats, Buffer, Capabilities
from tierkv.errors import BackendIOError
from tierkv_backends.dram import DramBackend


class ReadFailingDram(Backend):
    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        opts = dict(options or {})
        self.ok_reads = int(opts.pop("ok_reads", 0))
        super().__init__(opts, name=name)
        self.reads = 0
        self.failed_reads = 0
        self.inner: DramBackend | None = None

    async def _open(self) -> None:
        self.inner = await DramBackend.open(self.options, name=self.name, context=self.context)

    async def _close(self) -> None:
        if self.inner is not None:
            await self.inner.aclose()

    def _in(self) -> DramBackend:
        assert self.inner is not None
        return self.inner

    @property
    def capabilities(self) -> Capabilities:
        return self._in().capabilities

    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        return await self._in().allocate(key, nbytes, tag=tag)

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        await self._in().write(allocation, data)

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        self.reads += 1
        if self.reads > self.ok_reads:
            self.failed_reads += 1
            raise BackendIOError(f"injected: read of {key!r} failed", tier=self.name)
        return await self._in().read(key, into=into)

    async def evict(self, key: str) -> bool:
        return await self._in().evict(key)

    async def contains(self, key: str) -> bool:
        return await self._in().contains(key)

    def stats(self) -> BackendStats:
        return self._in().stats()
