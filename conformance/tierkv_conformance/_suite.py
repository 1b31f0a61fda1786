"""The conformance suite: a pytest base class that a backend package subclasses.

Usage (in the backend package's tests)::

    from tierkv_conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        backend_name = "mytier"          # entry-point name, or: backend_cls = MyBackend

        @pytest.fixture
        def backend_options(self, tmp_path):
            return {"capacity": "64MiB", "path": str(tmp_path / "blocks")}

Every test runs under asyncio and trio (the class defines ``anyio_backend``;
override it to restrict). Tests that depend on a capability the backend does
not declare are skipped with the reason. Class attributes tune the effort
(``cancel_iterations``, ``stateful_examples``, ...); ``--tierkv-quick`` on the
pytest command line lowers them.

Contract checked: the module docstring of :mod:`tierkv.backend`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import numpy as np
import pytest

from tierkv.backend import (
    API_VERSION,
    MAX_TAG_BYTES,
    Allocation,
    Availability,
    Backend,
    BackendStats,
    Capabilities,
    CertificationProfile,
    OpenContext,
    SupportsArrayIO,
    SupportsDeviceIO,
    SupportsScan,
    Taken,
)
from tierkv.errors import (
    BackendClosedError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ConfigError,
    InputError,
    PluginUnavailableError,
    TierKVError,
)

from ._loader import load_backend_class
from ._rules import PASS_RULES

__all__ = ["BackendConformance", "block_key", "pattern_bytes"]

T = TypeVar("T")
MiB = 1024 * 1024

_ANYIO_BACKENDS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param(
        "trio",
        id="trio",
        marks=pytest.mark.skipif(importlib.util.find_spec("trio") is None, reason="trio is not installed"),
    ),
]


def block_key(*parts: object) -> str:
    """A key shaped like the core's: 64 lower-case hex digits derived from ``parts``."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def pattern_bytes(n: int, seed: object) -> bytes:
    """``n`` reproducible pseudo-random bytes (distinct per ``seed``)."""
    s = int.from_bytes(hashlib.sha256(repr(seed).encode()).digest()[:8], "little")
    return np.random.default_rng(s).integers(0, 256, n, dtype=np.uint8).tobytes()


async def _expect(exc_type: type[BaseException], fn: Callable[[], Awaitable[Any]]) -> BaseException:
    """Await ``fn()`` and require it to raise ``exc_type`` (a TierKVError subclass)."""
    try:
        await fn()
    except TierKVError as exc:
        if not isinstance(exc, exc_type):
            raise AssertionError(f"expected {exc_type.__name__}, got {type(exc).__name__}: {exc}") from exc
        return exc
    except Exception as exc:
        raise AssertionError(
            f"expected {exc_type.__name__}, got foreign {type(exc).__module__}.{type(exc).__name__}: {exc} "
            "(every failure must be a TierKVError subclass)"
        ) from exc
    raise AssertionError(f"expected {exc_type.__name__}, but the call returned normally")


class BackendConformance:
    """Subclass me. Set ``backend_name`` (entry point in ``tierkv.backends``) or
    ``backend_cls``, and provide a ``backend_options(self, tmp_path)`` fixture
    (the default uses ``BackendCls.default_options(tmp_path)``).

    Hooks a subclass may override: :meth:`open_backend` (how to build an
    instance from options, e.g. to wrap it), and the effort knobs below.
    """

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio, pytest.mark.tierkv_conformance]

    #: Entry-point name in the ``tierkv.backends`` group (or set ``backend_cls``).
    backend_name: ClassVar[str | None] = None
    #: The backend class itself (takes precedence over ``backend_name``).
    backend_cls: ClassVar[type[Backend] | None] = None
    #: Upper bound of the "max" round-trip size (also bounded by capacity and max_block_bytes).
    max_roundtrip_bytes: ClassVar[int] = 64 * MiB
    #: Cancellation iterations per event loop.
    cancel_iterations: ClassVar[int] = 60
    #: Tasks in the concurrency tests.
    concurrency_tasks: ClassVar[int] = 24
    #: Hypothesis examples and steps for the stateful test.
    stateful_examples: ClassVar[int] = 20
    stateful_steps: ClassVar[int] = 30
    #: Seed for every random choice the suite makes (``--tierkv-seed`` overrides).
    seed: ClassVar[int] = 20240601

    # ------------------------------------------------------------------ fixtures
    @pytest.fixture(params=_ANYIO_BACKENDS)
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        """The backend's options; override in the subclass."""
        return dict(self.resolve_backend_class().default_options(tmp_path))

    @pytest.fixture
    def effort(self, request: pytest.FixtureRequest) -> float:
        """1.0 normally, 0.25 with ``--tierkv-quick``."""
        try:
            quick = bool(request.config.getoption("tierkv_quick"))
        except ValueError:
            quick = False
        return 0.25 if quick else 1.0

    @pytest.fixture
    def rng(self, request: pytest.FixtureRequest) -> random.Random:
        try:
            seed = request.config.getoption("tierkv_seed")
        except ValueError:
            seed = None
        return random.Random(f"{seed if seed is not None else self.seed}:{request.node.nodeid}")

    @pytest.fixture
    async def backend(self, backend_options: dict[str, Any]) -> AsyncIterator[Backend]:
        b = await self.open_backend(backend_options)
        try:
            yield b
        finally:
            with anyio.CancelScope(shield=True):
                await b.aclose()

    @classmethod
    def resolve_backend_class(cls) -> type[Backend]:
        if cls.backend_cls is not None:
            return cls.backend_cls
        if cls.backend_name:
            return load_backend_class(cls.backend_name)
        raise TypeError(f"{cls.__name__}: set backend_name or backend_cls")

    async def open_backend(self, options: Mapping[str, Any]) -> Backend:
        """Open a backend from ``options`` (override to wrap or to pass a name)."""
        return await self.resolve_backend_class().open(dict(options))

    # ------------------------------------------------------------------- helpers
    @staticmethod
    def free_bytes(b: Backend) -> int:
        s = b.stats()
        return max(0, s.capacity_bytes - s.used_bytes)

    async def put(self, b: Backend, key: str, data: bytes, *, tag: bytes = b"") -> Allocation:
        a = await b.allocate(key, len(data), tag=tag)
        await b.write(a, data)
        return a

    async def assert_absent(self, b: Backend, key: str) -> None:
        assert not await b.contains(key), f"{key} is still visible"
        await _expect(BlockNotFoundError, lambda: b.read(key))

    async def assert_block(self, b: Backend, key: str, data: bytes) -> None:
        assert await b.contains(key)
        got = await b.read(key)
        assert isinstance(got, memoryview), f"read must return a memoryview, got {type(got).__name__}"
        assert len(got) == len(data)
        assert bytes(got) == data, "read returned different bytes than written"

    @staticmethod
    def footprint(b: Backend, nbytes: int) -> int:
        """Bytes a block of ``nbytes`` counts in ``used_bytes``: exactly ``nbytes``, or ``nbytes``
        rounded up to ``stats().details["granule"]`` when the backend declares an allocation granule."""
        g = b.stats().details.get("granule", 1)
        g = g if isinstance(g, int) and not isinstance(g, bool) and g >= 1 else 1
        return -(-nbytes // g) * g

    @staticmethod
    def assert_accounting(s: BackendStats, base: BackendStats, *, committed: int, reserved: int, blocks: int) -> None:
        assert s.used_bytes == base.used_bytes + committed + reserved, (
            f"used_bytes={s.used_bytes}, expected {base.used_bytes} + {committed} committed + {reserved} reserved"
        )
        assert s.reserved_bytes == base.reserved_bytes + reserved, (
            f"reserved_bytes={s.reserved_bytes}, expected {base.reserved_bytes + reserved}"
        )
        assert s.blocks == base.blocks + blocks, f"blocks={s.blocks}, expected {base.blocks + blocks}"

    def require(self, cond: bool, reason: str) -> None:
        if not cond:
            pytest.skip(reason)

    # ================================================================ declaration
    async def test_declaration(self, backend: Backend, tmp_path: Path) -> None:
        """api_version, probe(), default_options() and capabilities are well formed."""
        cls = type(backend)
        assert isinstance(backend, Backend)
        assert cls.api_version == API_VERSION
        av = cls.probe()
        assert isinstance(av, Availability)
        # a backend running on a stand-in for its hardware may honestly say the hardware is absent
        assert av.usable or backend.stats().emulated, f"probe() says unusable: {av}"
        if not av.usable:
            assert av.reason, "an unusable probe() says why"
        try:
            defaults = cls.default_options(tmp_path / "defaults")
        except PluginUnavailableError:
            pass
        else:
            assert isinstance(defaults, dict)
        caps = backend.capabilities
        assert isinstance(caps, Capabilities)
        assert caps == backend.capabilities, "capabilities must be constant"
        assert caps.alignment >= 1 and caps.max_block_bytes >= 1 and caps.max_concurrency >= 1
        # what certify is told is descriptive only; the pass rule is the suite's, by tier kind
        assert isinstance(cls.certification, CertificationProfile)
        assert caps.tier_kind in PASS_RULES, f"no pass rule for tier kind {caps.tier_kind!r}"
        if caps.persistent:
            assert isinstance(backend, SupportsScan), "persistent backends implement SupportsScan.scan()"
        if caps.device_resident:
            assert isinstance(backend, SupportsDeviceIO), "device-resident backends implement SupportsDeviceIO"
        s = backend.stats()
        assert isinstance(s, BackendStats)
        assert s.capacity_bytes >= 0 and 0 <= s.reserved_bytes <= s.used_bytes

    # ================================================================= lifecycle
    async def test_lifecycle_close_is_idempotent_and_final(self, backend_options: dict[str, Any]) -> None:
        b = await self.open_backend(backend_options)
        assert not b.closed
        key = block_key("lifecycle")
        a = await b.allocate(key, 3)
        await b.aclose()
        assert b.closed
        await b.aclose()  # idempotent
        assert isinstance(b.stats(), BackendStats), "stats() must work after close"
        await _expect(BackendClosedError, lambda: b.allocate(block_key("x"), 1))
        await _expect(BackendClosedError, lambda: b.write(a, b"abc"))
        await _expect(BackendClosedError, lambda: b.read(key))
        await _expect(BackendClosedError, lambda: b.evict(key))
        await _expect(BackendClosedError, lambda: b.contains(key))
        if isinstance(b, SupportsScan):
            await _expect(BackendClosedError, lambda: b.scan())

    async def test_lifecycle_async_with(self, backend_options: dict[str, Any]) -> None:
        b = await self.open_backend(backend_options)
        async with b as entered:
            assert entered is b
            await self.put(b, block_key("ctx"), b"hello")
        assert b.closed
        await _expect(BackendClosedError, lambda: b.read(block_key("ctx")))

    async def test_lifecycle_open_takes_a_context(self, backend_options: dict[str, Any]) -> None:
        """``open(..., context=OpenContext(block_nbytes=N))`` (what TierKV passes) is accepted and
        kept in ``backend.context``; a block of N bytes then round-trips where it fits."""
        n = 64 * 1024
        b = await self.resolve_backend_class().open(dict(backend_options), context=OpenContext(block_nbytes=n))
        try:
            assert b.context.block_nbytes == n
            if b.capabilities.max_block_bytes >= n and self.free_bytes(b) >= self.footprint(b, n):
                data = bytes(range(256)) * (n // 256)
                key = block_key("context")
                await self.put(b, key, data)
                await self.assert_block(b, key, data)
                await b.evict(key)
        finally:
            with anyio.CancelScope(shield=True):
                await b.aclose()

    # ================================================================ accounting
    async def test_allocate_accounting_is_exact(self, backend: Backend) -> None:
        base = backend.stats()
        n = min(12345, self.free_bytes(backend), backend.capabilities.max_block_bytes)
        self.require(n > 0, "no free capacity")
        key = block_key("acct")
        a = await backend.allocate(key, n, tag=b"t")
        assert (a.key, a.nbytes, a.tag) == (key, n, b"t")
        fp = self.footprint(backend, n)
        self.assert_accounting(backend.stats(), base, committed=0, reserved=fp, blocks=0)
        assert not await backend.contains(key), "a reservation must not be visible"
        await _expect(BlockNotFoundError, lambda: backend.read(key))
        await backend.write(a, pattern_bytes(n, key))
        self.assert_accounting(backend.stats(), base, committed=fp, reserved=0, blocks=1)
        s = backend.stats()
        assert s.capacity_bytes == base.capacity_bytes
        assert await backend.evict(key) is True
        self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)
        # an evicted reservation frees its bytes too
        a2 = await backend.allocate(key, n)
        assert await backend.evict(key) is True
        self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)
        await _expect(BlockNotFoundError, lambda: backend.write(a2, pattern_bytes(n, key)))
        await self.assert_absent(backend, key)

    async def test_allocate_rejects_bad_input(self, backend: Backend) -> None:
        caps = backend.capabilities
        base = backend.stats()
        for bad in ["", "a/b", "x" * 129, "with space", "ü", 42, None, b"bytes"]:
            await _expect(InputError, functools.partial(backend.allocate, bad, 1))  # type: ignore[arg-type]
        await _expect(InputError, lambda: backend.allocate(block_key("neg"), -1))
        await _expect(InputError, lambda: backend.allocate(block_key("big"), caps.max_block_bytes + 1))
        await _expect(InputError, lambda: backend.allocate(block_key("tag"), 1, tag=b"x" * (MAX_TAG_BYTES + 1)))
        self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)
        # the widest valid keys are accepted
        for key in ["aZ09._-", "k" * 128, block_key("ok")]:
            await self.put(backend, key, b"v", tag=b"\x00" * MAX_TAG_BYTES)
            assert await backend.evict(key)

    async def test_allocate_existing_key_raises(self, backend: Backend) -> None:
        key = block_key("dup")
        a = await backend.allocate(key, 4)
        await _expect(BlockExistsError, lambda: backend.allocate(key, 4))
        await backend.write(a, b"abcd")
        await _expect(BlockExistsError, lambda: backend.allocate(key, 8))
        await self.assert_block(backend, key, b"abcd")

    # ================================================================ round trips
    @pytest.mark.parametrize("size_name", ["0", "1", "alignment-1", "alignment", "alignment+1", "max"])
    async def test_round_trip(self, backend: Backend, size_name: str) -> None:
        caps = backend.capabilities
        al = caps.alignment
        size = {
            "0": 0,
            "1": 1,
            "alignment-1": al - 1,
            "alignment": al,
            "alignment+1": al + 1,
            "max": min(caps.max_block_bytes, self.max_roundtrip_bytes, self.free_bytes(backend)),
        }[size_name]
        self.require(size <= min(caps.max_block_bytes, self.free_bytes(backend)), f"{size} bytes exceed capacity")
        key = block_key("rt", size_name)
        data = pattern_bytes(size, key)
        tag = b"tag:" + size_name.encode()
        await self.put(backend, key, data, tag=tag)
        await self.assert_block(backend, key, data)
        # into= a larger buffer: the result views its first nbytes
        into = bytearray(size + 7)
        got = await backend.read(key, into=into)
        assert len(got) == size and bytes(got) == data and bytes(into[:size]) == data
        if isinstance(backend, SupportsScan):
            infos = {i.key: i for i in await backend.scan()}
            assert infos[key].nbytes == size and infos[key].tag == tag

    @pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "numpy-uint8", "numpy-float32"])
    async def test_buffer_types(self, backend: Backend, kind: str) -> None:
        raw = pattern_bytes(4096, kind)
        data: Any = {
            "bytes": raw,
            "bytearray": bytearray(raw),
            "memoryview": memoryview(raw),
            "numpy-uint8": np.frombuffer(raw, dtype=np.uint8).copy(),
            "numpy-float32": np.frombuffer(raw, dtype=np.float32).copy(),
        }[kind]
        key = block_key("buf", kind)
        a = await backend.allocate(key, len(raw))
        await backend.write(a, data)
        await self.assert_block(backend, key, raw)
        out = np.zeros(len(raw) // 4, dtype=np.float32)
        got = await backend.read(key, into=out)
        assert bytes(got) == raw and out.tobytes() == raw

    async def test_read_result_owns_its_buffer(self, backend: Backend) -> None:
        """A read without ``into`` returns a fresh buffer: evicting and rewriting the key does not change it."""
        key = block_key("own")
        old, new = pattern_bytes(65536, "old"), pattern_bytes(65536, "new")
        await self.put(backend, key, old)
        first = await backend.read(key)
        assert await backend.evict(key)
        await self.put(backend, key, new)
        assert bytes(first) == old, "an earlier read result changed after evict + rewrite"
        await self.assert_block(backend, key, new)

    async def test_write_and_read_errors(self, backend: Backend) -> None:
        key = block_key("werr")
        bads: tuple[Any, ...] = (b"short", b"x" * 17, object())
        for bad in bads:
            a = await backend.allocate(key, 16)
            await _expect(InputError, lambda: backend.write(a, bad))  # noqa: B023
            assert not await backend.contains(key)
            await backend.evict(key)  # the failed write may or may not have released the reservation
        a = await backend.allocate(key, 16)
        await backend.write(a, b"0123456789abcdef")
        await _expect(BlockNotFoundError, lambda: backend.write(a, b"0123456789abcdef"))  # consumed
        forged = Allocation(block_key("never-allocated"), 16)
        await _expect(BlockNotFoundError, lambda: backend.write(forged, b"0123456789abcdef"))
        await _expect(InputError, lambda: backend.read(key, into=bytearray(15)))
        await _expect(InputError, lambda: backend.read(key, into=b"\x00" * 16))
        await _expect(InputError, lambda: backend.read(key, into=np.zeros((4, 8), dtype=np.uint8)[:, ::2]))
        await _expect(BlockNotFoundError, lambda: backend.read(block_key("missing")))
        await _expect(InputError, lambda: backend.read("bad key"))
        await _expect(InputError, lambda: backend.evict("bad/key"))
        await _expect(InputError, lambda: backend.contains(""))
        await self.assert_block(backend, key, b"0123456789abcdef")

    # ==================================================================== evict
    async def test_evict_is_idempotent(self, backend: Backend) -> None:
        base = backend.stats()
        key = block_key("evict")
        assert await backend.evict(key) is False
        await self.put(backend, key, b"data")
        assert await backend.evict(key) is True
        assert await backend.evict(key) is False
        await self.assert_absent(backend, key)
        self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)

    async def test_no_stale_data_after_evict(self, backend: Backend) -> None:
        key = block_key("stale")
        old = pattern_bytes(8192, "stale-old")
        await self.put(backend, key, old)
        await self.assert_block(backend, key, old)  # warm any cache
        assert await backend.evict(key)
        await self.assert_absent(backend, key)
        new = pattern_bytes(8192, "stale-new")
        await self.put(backend, key, new)
        await self.assert_block(backend, key, new)

    # ================================================================ capacity
    async def test_capacity_exhaustion_and_recovery(self, backend: Backend) -> None:
        caps = backend.capabilities
        base = backend.stats()
        free = self.free_bytes(backend)
        self.require(free > 0, "backend reports no free capacity")
        size = max(1, min(caps.max_block_bytes, 1 * MiB, free // 4))
        self.require(free // size <= 100_000, f"capacity {free} too large to exhaust with {size}-byte blocks")
        keys: list[str] = []
        while True:
            key = block_key("cap", len(keys))
            try:
                await backend.allocate(key, size)
            except CapacityError:
                break
            keys.append(key)
        fp = self.footprint(backend, size)
        assert len(keys) == free // fp, f"{len(keys)} allocations of {size} (footprint {fp}) fit into {free} free bytes"
        s = backend.stats()
        assert s.used_bytes + fp > s.capacity_bytes
        # the rest that still fits is granted exactly
        rest = s.capacity_bytes - s.used_bytes
        if 0 < rest <= caps.max_block_bytes:
            await backend.allocate(block_key("cap-rest"), rest)
            keys.append(block_key("cap-rest"))
            await _expect(CapacityError, lambda: backend.allocate(block_key("cap-one"), 1))
        # evict one: its space comes back, and a committed block counts like a reservation
        assert await backend.evict(keys[0])
        a = await backend.allocate(block_key("cap-again"), size)
        if size <= 4 * MiB:
            data = pattern_bytes(size, "cap")
            await backend.write(a, data)
            await self.assert_block(backend, block_key("cap-again"), data)
        await _expect(CapacityError, lambda: backend.allocate(block_key("cap-over"), size))
        for key in [*keys[1:], block_key("cap-again")]:
            await backend.evict(key)
        self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)

    # ============================================================== cancellation
    def _cancel_sizes(self, b: Backend) -> list[int]:
        caps = b.capabilities
        cap = min(caps.max_block_bytes, self.free_bytes(b) // 2)
        return [s for s in (1, caps.alignment, 64 * 1024, 1 * MiB, 4 * MiB) if 0 < s <= cap] or [0]

    @staticmethod
    async def _run_cancelled(rng: random.Random, op: Callable[[], Awaitable[Any]]) -> bool:
        """Run ``op`` under a cancel scope cancelled at a random point; return True if it completed."""
        done = False
        mode = rng.random()
        if mode < 0.4:
            scope = anyio.CancelScope(deadline=anyio.current_time() + rng.choice([0.0, 1e-5, 1e-4, 5e-4, 2e-3]))
        else:
            scope = anyio.CancelScope()

        async def runner() -> None:
            nonlocal done
            with scope:
                await op()
                done = True

        async def canceller(k: int) -> None:
            for _ in range(k):
                await anyio.lowlevel.checkpoint()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(runner)
            if mode >= 0.4:
                tg.start_soon(canceller, rng.randrange(0, 6))
        return done

    async def test_cancelled_write_is_atomic(self, backend: Backend, rng: random.Random, effort: float) -> None:
        base = backend.stats()
        sizes = self._cancel_sizes(backend)
        for i in range(max(4, int(self.cancel_iterations * effort))):
            key = block_key("cancel-write", i)
            data = pattern_bytes(rng.choice(sizes), key)
            a = await backend.allocate(key, len(data))
            done = await self._run_cancelled(rng, functools.partial(backend.write, a, data))
            if done:
                await self.assert_block(backend, key, data)
                assert await backend.evict(key)
            else:
                await self.assert_absent(backend, key)
                self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)
                await _expect(BlockNotFoundError, lambda: backend.write(a, data))  # noqa: B023
                a2 = await backend.allocate(key, len(data))  # no leftover reservation or block
                await backend.evict(a2.key)
            self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)

    async def test_cancelled_read_and_evict_leave_a_whole_block(
        self, backend: Backend, rng: random.Random, effort: float
    ) -> None:
        base = backend.stats()
        sizes = self._cancel_sizes(backend)
        for i in range(max(4, int(self.cancel_iterations * effort) // 2)):
            key = block_key("cancel-re", i)
            data = pattern_bytes(rng.choice(sizes), key)
            await self.put(backend, key, data)
            await self._run_cancelled(rng, functools.partial(backend.read, key))
            await self.assert_block(backend, key, data)
            evicted = await self._run_cancelled(rng, functools.partial(backend.evict, key))
            if await backend.contains(key):
                assert not evicted
                await self.assert_block(backend, key, data)
                self.assert_accounting(
                    backend.stats(), base, committed=self.footprint(backend, len(data)), reserved=0, blocks=1
                )
                assert await backend.evict(key)
            else:
                await self.assert_absent(backend, key)
            self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)

    # =============================================================== concurrency
    async def test_concurrent_distinct_keys(self, backend: Backend, rng: random.Random) -> None:
        base = backend.stats()
        n = self.concurrency_tasks
        size = max(1, min(64 * 1024, self.free_bytes(backend) // (n + 1)))
        blobs = {block_key("cd", i): pattern_bytes(size, ("cd", i)) for i in range(n)}
        errors: list[str] = []

        async def writer(k: str, v: bytes) -> None:
            await self.put(backend, k, v)

        async def reader(keys: list[str]) -> None:
            for k in keys:
                if bytes(await backend.read(k)) != blobs[k]:
                    errors.append(k)

        async with anyio.create_task_group() as tg:
            for k, v in blobs.items():
                tg.start_soon(writer, k, v)
        self.assert_accounting(backend.stats(), base, committed=n * self.footprint(backend, size), reserved=0, blocks=n)
        keys = list(blobs)
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(reader, rng.sample(keys, min(8, n)))
        assert not errors, f"concurrent reads returned wrong bytes for {errors}"
        async with anyio.create_task_group() as tg:
            for k in keys:
                tg.start_soon(backend.evict, k)
        self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)

    async def test_concurrent_same_key(self, backend: Backend) -> None:
        base = backend.stats()
        key = block_key("same")
        n = self.concurrency_tasks
        data = pattern_bytes(32 * 1024, key)
        wins: list[Allocation] = []
        losers: list[BaseException] = []

        async def allocator() -> None:
            try:
                wins.append(await backend.allocate(key, len(data)))
            except TierKVError as exc:
                losers.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(allocator)
        assert len(wins) == 1, f"{len(wins)} concurrent allocations of one key succeeded"
        assert all(isinstance(e, BlockExistsError) for e in losers), [type(e).__name__ for e in losers]
        await backend.write(wins[0], data)
        bad: list[int] = []

        async def reader() -> None:
            if bytes(await backend.read(key)) != data:
                bad.append(1)

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(reader)
        assert not bad
        results: list[bool] = []

        async def evicter() -> None:
            results.append(await backend.evict(key))

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(evicter)
        assert sorted(results) == [False] * (n - 1) + [True], "exactly one concurrent evict removes the block"
        self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)

    async def test_concurrent_readers_racing_evict(self, backend: Backend, rng: random.Random) -> None:
        """Readers racing an evict see the whole block or BlockNotFoundError, never wrong bytes."""
        base = backend.stats()
        for round_ in range(6):
            key = block_key("race", round_)
            data = pattern_bytes(rng.choice(self._cancel_sizes(backend)), key)
            await self.put(backend, key, data)
            seen = {"ok": 0, "gone": 0}
            wrong: list[int] = []

            async def reader() -> None:
                for _ in range(4):
                    try:
                        got = await backend.read(key)  # noqa: B023
                    except BlockNotFoundError:
                        seen["gone"] += 1  # noqa: B023
                        return
                    if bytes(got) != data:  # noqa: B023
                        wrong.append(1)  # noqa: B023
                    seen["ok"] += 1  # noqa: B023

            async def evicter(k: int) -> None:
                for _ in range(k):
                    await anyio.lowlevel.checkpoint()
                assert await backend.evict(key)  # noqa: B023

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(reader)
                tg.start_soon(evicter, rng.randrange(0, 10))
            assert not wrong, "a read racing an evict returned wrong bytes"
            await self.assert_absent(backend, key)
        self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)

    async def test_concurrent_write_racing_evict_of_its_reservation(self, backend: Backend, rng: random.Random) -> None:
        base = backend.stats()
        for round_ in range(8):
            key = block_key("wre", round_)
            data = pattern_bytes(rng.choice(self._cancel_sizes(backend)), key)
            a = await backend.allocate(key, len(data))
            outcome: dict[str, Any] = {}

            async def writer() -> None:
                try:
                    await backend.write(a, data)  # noqa: B023
                    outcome["write"] = "ok"  # noqa: B023
                except BlockNotFoundError:
                    outcome["write"] = "dropped"  # noqa: B023

            async def evicter(k: int) -> None:
                for _ in range(k):
                    await anyio.lowlevel.checkpoint()
                outcome["evict"] = await backend.evict(key)  # noqa: B023

            async with anyio.create_task_group() as tg:
                tg.start_soon(writer)
                tg.start_soon(evicter, rng.randrange(0, 6))
            assert outcome["evict"] is True, "evict must find the reservation or the block"
            await self.assert_absent(backend, key)
            self.assert_accounting(backend.stats(), base, committed=0, reserved=0, blocks=0)

    # ============================================================ error hygiene
    async def test_error_hygiene_every_failure_is_a_tierkv_error(
        self, backend: Backend, backend_options: dict[str, Any]
    ) -> None:
        """Each misuse raises the documented TierKVError subclass (types checked, not messages)."""
        cls = self.resolve_backend_class()
        try:
            cls({**backend_options, "tierkv_conformance_unknown_option": object()})
        except TierKVError as exc:
            assert isinstance(exc, ConfigError), f"an unknown option raised {type(exc).__name__}, not ConfigError"
        except Exception as exc:
            raise AssertionError(f"an unknown option raised foreign {type(exc).__name__}") from exc
        assert issubclass(BlockNotFoundError, KeyError)
        missing = await _expect(BlockNotFoundError, lambda: backend.read(block_key("nothing")))
        assert isinstance(missing, KeyError)
        cases: list[tuple[type[TierKVError], Callable[[], Awaitable[Any]]]] = [
            (InputError, lambda: backend.allocate("../etc/passwd", 1)),
            (InputError, lambda: backend.allocate(block_key("f"), 1.5)),  # type: ignore[arg-type]
            (InputError, lambda: backend.allocate(block_key("t"), 1, tag="str")),  # type: ignore[arg-type]
            (InputError, lambda: backend.read(123)),  # type: ignore[arg-type]
            (BlockNotFoundError, lambda: backend.write(Allocation(block_key("forged"), 1), b"x")),
        ]
        for expected, call in cases:
            await _expect(expected, call)

    # ======================================================== persistence, scan
    async def test_scan_lists_committed_blocks_only(self, backend: Backend) -> None:
        self.require(isinstance(backend, SupportsScan), "capability: backend does not implement SupportsScan")
        assert isinstance(backend, SupportsScan)
        before = {i.key for i in await backend.scan()}
        await self.put(backend, block_key("scan", 1), b"one", tag=b"t1")
        await self.put(backend, block_key("scan", 2), b"", tag=b"")
        await backend.allocate(block_key("scan", "pending"), 10)
        infos = {i.key: i for i in await backend.scan() if i.key not in before}
        assert set(infos) == {block_key("scan", 1), block_key("scan", 2)}, "scan lists reservations or misses blocks"
        assert (infos[block_key("scan", 1)].nbytes, infos[block_key("scan", 1)].tag) == (3, b"t1")
        await backend.evict(block_key("scan", 1))
        assert block_key("scan", 1) not in {i.key for i in await backend.scan()}

    async def test_persistence_across_reopen(self, backend_options: dict[str, Any], rng: random.Random) -> None:
        b = await self.open_backend(backend_options)
        try:
            self.require(b.capabilities.persistent, f"capability: {type(b).__name__} declares persistent=False")
            base = b.stats()
            sizes = [0, 1, b.capabilities.alignment, 100_000]
            blobs = {block_key("persist", i, s): pattern_bytes(s, ("p", i)) for i, s in enumerate(sizes)}
            tags = {k: f"tag{i}".encode() for i, k in enumerate(blobs)}
            for k, v in blobs.items():
                await self.put(b, k, v, tag=tags[k])
            await self.put(b, block_key("persist", "gone"), b"evicted")
            await b.evict(block_key("persist", "gone"))
            await b.allocate(block_key("persist", "pending"), 4096)
        finally:
            await b.aclose()
        b2 = await self.open_backend(backend_options)
        try:
            assert isinstance(b2, SupportsScan)
            infos = {i.key: i for i in await b2.scan()}
            for k, v in blobs.items():
                assert k in infos, f"committed block {k} missing after reopen"
                assert (infos[k].nbytes, infos[k].tag) == (len(v), tags[k])
                await self.assert_block(b2, k, v)
            assert block_key("persist", "gone") not in infos and block_key("persist", "pending") not in infos
            await self.assert_absent(b2, block_key("persist", "pending"))
            self.assert_accounting(
                b2.stats(),
                base,
                committed=sum(self.footprint(b2, len(v)) for v in blobs.values()),
                reserved=0,
                blocks=len(blobs),
            )
            a = await b2.allocate(block_key("persist", "pending"), 4096)  # the dropped reservation is free again
            await b2.evict(a.key)
        finally:
            await b2.aclose()

    async def test_shared_visibility(self, backend_options: dict[str, Any]) -> None:
        b = await self.open_backend(backend_options)
        try:
            self.require(b.capabilities.shared, f"capability: {type(b).__name__} declares shared=False")
            key, data = block_key("shared"), pattern_bytes(5000, "shared")
            await self.put(b, key, data)
            other = await self.open_backend(backend_options)
            try:
                await self.assert_block(other, key, data)
            finally:
                await other.aclose()
        finally:
            await b.aclose()

    # ============================================================== device I/O
    async def test_device_round_trip(self, backend: Backend) -> None:
        self.require(isinstance(backend, SupportsDeviceIO), "capability: backend has no device I/O")
        self.require(importlib.util.find_spec("torch") is not None, "torch is not installed")
        import torch

        self.require(bool(torch.cuda.is_available()), "no CUDA device visible to torch")
        assert isinstance(backend, SupportsDeviceIO)
        for n in (4096, 3 * 4096 + 5):
            src = (torch.arange(n, device="cuda") % 251).to(torch.uint8)
            key = block_key(f"dev{n}")
            a = await backend.allocate(key, n)
            await backend.write_device(a, src)
            out = torch.zeros(n + 7, dtype=torch.uint8, device="cuda")
            got = await backend.read_device(key, into=out)
            assert bool(torch.equal(out[:n], src)) and bool(torch.equal(got.reshape(-1)[:n], src))
            assert bytes(await backend.read(key)) == src.cpu().numpy().tobytes()
            host = bytes(range(256)) * (n // 256) + bytes(n % 256)  # host-written, read to the device
            hkey = block_key(f"host{n}")
            await backend.write(await backend.allocate(hkey, n), host)
            got = await backend.read_device(hkey, into=out)
            assert got.reshape(-1)[:n].cpu().numpy().tobytes() == host

    # ========================================================= strided arrays
    async def test_array_io_round_trip(self, backend: Backend) -> None:
        self.require(isinstance(backend, SupportsArrayIO), "capability: backend has no strided array I/O")
        assert isinstance(backend, SupportsArrayIO)
        base = np.arange(6 * 8 * 40, dtype=np.uint16).reshape(6, 8, 40)
        sources = {
            "slice": base[:, :, 5:21],  # a view of a larger cache
            "fortran": np.asfortranarray(base[:, :4]),
            "reversed": base[::-1, ::2],
        }
        for name, src in sources.items():
            key = block_key("arr", name)
            a = await backend.allocate(key, src.nbytes)
            await backend.write_arrays([a], [src])
            assert bytes(await backend.read(key)) == np.ascontiguousarray(src).tobytes(), name
            big = np.zeros((src.shape[0], 2 * src.shape[1], *src.shape[2:]), dtype=np.uint16)
            dst = big[:, ::2]  # a strided destination
            await backend.read_arrays([key], [dst])
            assert np.array_equal(dst, src) and not big[:, 1::2].any(), name
        # a block made of parts: engine blocks taken from a paged cache, then a plain array
        cache = np.arange(10 * 2 * 4 * 3, dtype=np.uint16).reshape(2, 10, 4, 3)  # [kv, blocks, tok, dim]
        ids = np.array([7, 2, 5])
        parts = [Taken(cache, ids, 1), base[0, :2]]
        want = np.take(cache, ids, axis=1).tobytes() + base[0, :2].tobytes()
        key = block_key("arr", "parts")
        a = await backend.allocate(key, len(want))
        await backend.write_arrays([a], [parts])
        assert bytes(await backend.read(key)) == want
        back = np.zeros_like(cache)
        tail = np.zeros_like(base[0, :2])
        await backend.read_arrays([key], [[Taken(back, ids, 1), tail]])
        assert np.array_equal(back[:, ids], cache[:, ids]) and not back[:, [0, 1, 3, 4, 6, 8, 9]].any()
        assert np.array_equal(tail, base[0, :2])
        # a size mismatch commits nothing and frees the reservation; a read-only destination is refused
        key = block_key("arr", "bad")
        a = await backend.allocate(key, 100)
        with pytest.raises(InputError):
            await backend.write_arrays([a], [np.zeros(49, np.uint16)])
        assert not await backend.contains(key)
        ro = np.zeros_like(sources["slice"])
        ro.flags.writeable = False
        with pytest.raises(InputError):
            await backend.read_arrays([block_key("arr", "slice")], [ro])
        with pytest.raises(BlockNotFoundError):
            await backend.read_arrays([block_key("arr", "absent")], [np.zeros(4, np.uint8)])

    # ====================================================== stateful (hypothesis)
    def test_stateful_against_dict_model(
        self, backend_options: dict[str, Any], anyio_backend: str, effort: float
    ) -> None:
        from ._stateful import run_stateful

        with anyio.from_thread.start_blocking_portal(anyio_backend) as portal:
            run_stateful(
                portal,
                functools.partial(self.open_backend, backend_options),
                max_examples=max(3, int(self.stateful_examples * effort)),
                steps=self.stateful_steps,
            )
