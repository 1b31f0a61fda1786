"""A device-resident tier for the CPU tests of the accelerator path (tests/test_device_path.py):
a DRAM tier that also implements :class:`tierkv.backend.SupportsDeviceIO` for torch tensors of the
device types taken as accelerators (the tests add ``"cpu"``), and not ``SupportsArrayIO``, as HBM.
Registered as backend ``cpu-device`` through a dist-info directory the test puts on ``sys.path``.
It counts the blocks that reached it on the device path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tierkv.backend import Allocation, Backend, BackendStats, Buffer, Capabilities, is_device_tensor
from tierkv.errors import InputError
from tierkv_backends.dram import DramBackend


class CpuDeviceTier(Backend):
    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(dict(options or {}), name=name)
        self.inner: DramBackend | None = None
        self.device_writes = 0
        self.device_reads = 0

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
        return await self._in().read(key, into=into)

    async def evict(self, key: str) -> bool:
        return await self._in().evict(key)

    async def contains(self, key: str) -> bool:
        return await self._in().contains(key)

    def stats(self) -> BackendStats:
        return self._in().stats()

    async def write_device(self, allocation: Allocation, tensor: Any) -> None:
        if not is_device_tensor(tensor) or not tensor.is_contiguous() or tensor.numel() != allocation.nbytes:
            raise InputError(f"[{self.name}] tensor must be a contiguous device tensor of {allocation.nbytes} bytes")
        await self._in().write(allocation, tensor.numpy().data)
        self.device_writes += 1

    async def read_device(self, key: str, *, into: Any) -> Any:
        import torch

        mv = await self._in().read(key)
        n = len(mv)
        if not is_device_tensor(into) or into.numel() < n:
            raise InputError(f"[{self.name}] into must be a device tensor of at least {n} bytes")
        into[:n].copy_(torch.from_numpy(np.frombuffer(mv, dtype=np.uint8).copy()))
        self.device_reads += 1
        return into[:n]
