"""A tierkv backend storing blocks on a Redis server.

Options (all optional):
    host, port, db       server address (default 127.0.0.1:6379, db 0)
    prefix               namespace of this tier's keys (default ``"tierkv:"``)
    capacity             bytes this tier may use on the server (default 256MiB)
    max_block_bytes      largest block (default 64MiB; Redis strings hold up to 512MB)
    max_concurrency      worker threads / pooled connections (default 8)
    spawn_server         start a private ``redis-server`` on 127.0.0.1 on a free port
                         (the default for ``tierkv certify redis``); it is stopped by pid on close
    redis_server         the redis-server executable for spawn_server (default: found on PATH)
    workdir              working directory of a spawned server

Design: the synchronous ``redis`` client runs in worker threads (``anyio.to_thread``
with a limiter), so the backend works under asyncio and trio alike. Reservations
and capacity are tracked locally; a commit is one MULTI/EXEC transaction that
SETs the block (``magic | tag length | tag | data``) and adds the key to the
tier's index set, so a block is either wholly visible or absent. Other
instances with the same prefix see committed blocks (shared=True) and rebuild
their accounting from the index on open. A block lost by the server (its own
maxmemory eviction) is reported as BlockNotFoundError.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import redis
from tierkv_conformance import RawMeasurement

from tierkv import (
    MAX_TAG_BYTES,
    Allocation,
    Availability,
    Backend,
    BackendIOError,
    BackendStats,
    BlockExistsError,
    BlockInfo,
    BlockNotFoundError,
    Buffer,
    Capabilities,
    CapacityError,
    InputError,
    IntegrityError,
    PluginUnavailableError,
    TierKind,
    as_byte_view,
    check_allocation,
    into_view,
    validate_key,
)
from tierkv._backend import run_blocking
from tierkv._options import opt_bool, opt_int, opt_size, opt_str, reject_unknown

__all__ = ["RedisBackend"]

T = TypeVar("T")
_MAGIC = b"TKV1"
_HDR = struct.Struct("<4sH")
_KNOWN = frozenset(
    {
        "host",
        "port",
        "db",
        "prefix",
        "capacity",
        "max_block_bytes",
        "max_concurrency",
        "spawn_server",
        "redis_server",
        "workdir",
    }
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisBackend(Backend):
    """Remote tier on Redis. See the module docstring for options and design."""

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(options, name=name or "redis")
        o = self.options
        reject_unknown(o, _KNOWN)
        self._spawn = opt_bool(o, "spawn_server", False)
        self._host = opt_str(o, "host", "127.0.0.1")
        self._port = opt_int(o, "port", 6379, minimum=0, maximum=65535)
        self._db = opt_int(o, "db", 0, minimum=0)
        self._prefix = opt_str(o, "prefix", "tierkv:")
        self._capacity = opt_size(o, "capacity", "256MiB")
        self._max_block = opt_size(o, "max_block_bytes", "64MiB", minimum=1, maximum=512 * 1024 * 1024 - 512)
        self._max_conc = opt_int(o, "max_concurrency", 8, minimum=1, maximum=256)
        self._server_exe = opt_str(o, "redis_server", "redis-server")
        self._workdir = opt_str(o, "workdir", "", allow_empty=True)
        self._index = f"{self._prefix}index"
        self._blocks: dict[str, tuple[int, bytes]] = {}
        self._pending: dict[str, Allocation] = {}
        self._used = 0
        self._reserved = 0
        self._handles = itertools.count(1)
        self._n = {"reads": 0, "writes": 0, "evictions": 0, "bytes_read": 0, "bytes_written": 0}
        self._client: redis.Redis | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._limiter = anyio.CapacityLimiter(self._max_conc)

    # ----------------------------------------------------------------- declaration
    @classmethod
    def probe(cls) -> Availability:
        return Availability(True)

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        if shutil.which("redis-server") is None:
            raise PluginUnavailableError(
                "redis: no redis-server on PATH to start a private server",
                group="tierkv.backends",
                name="redis",
                hint="install redis-server (apt-get install redis-server) or pass --config with host/port",
            )
        return {"spawn_server": True, "workdir": str(workdir), "capacity": "256MiB"}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            tier_kind=TierKind.REMOTE,
            persistent=False,
            shared=not self._spawn,
            alignment=1,
            max_block_bytes=self._max_block,
            max_concurrency=self._max_conc,
            # declared honestly: a commit is one MULTI/EXEC (SET + index SADD) where the raw
            # client does a bare SET, and every read is checked, so large blocks reach about
            # half the raw client's rate on loopback; small blocks are graded per block
            envelope_threshold=0.25,
            envelope_small_block_bytes=64 * 1024,
            envelope_small_block_us=1000.0,
        )

    # ----------------------------------------------------------------- plumbing
    def _key(self, key: str) -> str:
        return f"{self._prefix}b:{key}"

    async def _run(self, fn: Callable[[], T], what: str, *, abandon: bool = False) -> T:
        """Run a client call in a worker thread; with ``abandon`` a cancelled caller does not
        wait for it (reads: the reply lands in bytes nobody else sees). A server at its
        ``maxmemory`` (OOM reply) is CapacityError; other client errors are BackendIOError."""
        try:
            return await run_blocking(fn, limiter=self._limiter, abandon_on_cancel=abandon)
        except redis.exceptions.OutOfMemoryError as exc:
            raise CapacityError(f"redis {what}: the server is full ({exc})", tier=self.name) from exc
        except redis.RedisError as exc:
            raise BackendIOError(f"redis {what} failed: {exc}", tier=self.name) from exc

    def _start_server(self) -> None:
        exe = shutil.which(self._server_exe)
        if exe is None:
            raise PluginUnavailableError(
                f"redis: {self._server_exe!r} not found",
                group="tierkv.backends",
                name=self.name,
                hint="install redis-server",
            )
        workdir = self._workdir or tempfile.mkdtemp(prefix="tierkv-redis-")
        os.makedirs(workdir, exist_ok=True)
        self._port = _free_port()
        self._host = "127.0.0.1"
        args = [exe, "--port", str(self._port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", workdir, "--daemonize", "no", "--protected-mode", "yes"]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _stop_server(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    async def _open(self) -> None:
        if self._spawn:
            await anyio.to_thread.run_sync(self._start_server)
        client = redis.Redis(
            host=self._host,
            port=self._port,
            db=self._db,
            max_connections=self._max_conc + 4,
            socket_timeout=30,
            single_connection_client=False,
        )
        deadline = time.monotonic() + (10 if self._spawn else 0)

        def connect() -> list[tuple[bytes, int, bytes]]:
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            keys = sorted(k.decode() for k in client.smembers(self._index))
            pipe = client.pipeline(transaction=False)
            for k in keys:
                pipe.getrange(self._key(k), 0, _HDR.size + MAX_TAG_BYTES - 1)
                pipe.strlen(self._key(k))
            res = pipe.execute()
            out = []
            for i, k in enumerate(keys):
                head, total = res[2 * i], res[2 * i + 1]
                if head and len(head) >= _HDR.size:
                    magic, tl = _HDR.unpack_from(head)
                    if magic == _MAGIC:
                        out.append((k.encode(), total - _HDR.size - tl, head[_HDR.size : _HDR.size + tl]))
            return out

        try:
            found = await self._run(connect, "connect")
        except BaseException:
            client.close()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._stop_server)
            raise
        self._client = client
        for k, n, tag in found:
            self._blocks[k.decode()] = (n, tag)
            self._used += n

    async def _close(self) -> None:
        self._pending.clear()
        self._used -= self._reserved
        self._reserved = 0
        client, self._client = self._client, None
        with anyio.CancelScope(shield=True):
            if client is not None:
                await anyio.to_thread.run_sync(client.close)
            await anyio.to_thread.run_sync(self._stop_server)

    @property
    def _c(self) -> redis.Redis:
        assert self._client is not None
        return self._client

    # --------------------------------------------------------------------- data
    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        self._check_open()
        check_allocation(key, nbytes, tag, max_block_bytes=self._max_block, tier=self.name)
        if key in self._blocks or key in self._pending:
            raise BlockExistsError(f"block {key!r} exists", tier=self.name)
        if self._used + nbytes > self._capacity:
            raise CapacityError(f"{nbytes} bytes do not fit ({self._used}/{self._capacity} used)", tier=self.name)
        a = Allocation(key, nbytes, tag, next(self._handles))
        self._pending[key] = a
        self._used += nbytes
        self._reserved += nbytes
        return a

    def _drop_pending(self, a: Allocation) -> None:
        if self._pending.get(a.key) is a:
            del self._pending[a.key]
            self._used -= a.nbytes
            self._reserved -= a.nbytes

    def _delete_sync(self, key: str) -> None:
        pipe = self._c.pipeline(transaction=True)
        pipe.delete(self._key(key))
        pipe.srem(self._index, key)
        pipe.execute()

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        self._check_open()
        a = self._pending.get(allocation.key)
        if a is None or a.handle != allocation.handle:
            raise BlockNotFoundError(f"no reservation for {allocation.key!r}", tier=self.name)
        mv = as_byte_view(data)
        if len(mv) != a.nbytes:
            self._drop_pending(a)
            raise InputError(f"[{self.name}] write of {len(mv)} bytes into a {a.nbytes}-byte allocation")
        client = self._c

        def commit() -> None:
            payload = b"".join((_HDR.pack(_MAGIC, len(a.tag)), a.tag, mv))
            pipe = client.pipeline(transaction=True)  # MULTI ... EXEC
            pipe.set(self._key(a.key), payload)
            pipe.sadd(self._index, a.key)
            pipe.execute()

        try:
            await self._run(commit, f"write {a.key!r}")
        except BaseException:
            # failed or cancelled: the transaction may have run; make sure nothing stays visible
            self._drop_pending(a)
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await anyio.to_thread.run_sync(self._delete_sync, a.key)
            raise
        if self._pending.get(a.key) is not a or self._closed:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await anyio.to_thread.run_sync(self._delete_sync, a.key)
            raise BlockNotFoundError(f"reservation for {a.key!r} was dropped during write", tier=self.name)
        del self._pending[a.key]
        self._reserved -= a.nbytes
        self._blocks[a.key] = (a.nbytes, a.tag)
        self._n["writes"] += 1
        self._n["bytes_written"] += a.nbytes

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        self._check_open()
        validate_key(key, tier=self.name)
        entry = self._blocks.get(key)
        if entry is None:
            raise BlockNotFoundError(f"no block {key!r}", tier=self.name)
        out: memoryview | None = None
        if into is not None:
            out = into_view(into, entry[0], tier=self.name)
        client = self._c
        # abandonable: the reply is copied into ``into`` here, after the thread returned
        raw = await self._run(lambda: client.get(self._key(key)), f"read {key!r}", abandon=True)
        if raw is None:
            if self._blocks.get(key) is entry:  # lost by the server itself
                del self._blocks[key]
                self._used -= entry[0]
            raise BlockNotFoundError(f"block {key!r} is gone from the server", tier=self.name)
        magic, tl = _HDR.unpack_from(raw) if len(raw) >= _HDR.size else (b"", 0)
        n = len(raw) - _HDR.size - tl
        if magic != _MAGIC or n != entry[0]:
            raise IntegrityError(f"block {key!r}: bad header or length {n} != {entry[0]}", tier=self.name)
        body = memoryview(raw)[_HDR.size + tl :]
        self._n["reads"] += 1
        self._n["bytes_read"] += n
        if out is not None:
            out[:n] = body
            return out[:n]
        return memoryview(bytearray(body))

    async def evict(self, key: str) -> bool:
        self._check_open()
        validate_key(key, tier=self.name)
        a = self._pending.get(key)
        if a is not None:
            self._drop_pending(a)
            return True
        entry = self._blocks.pop(key, None)
        if entry is None:
            return False
        self._used -= entry[0]
        self._n["evictions"] += 1
        with anyio.CancelScope(shield=True):
            await self._run(lambda: self._delete_sync(key), f"evict {key!r}")
        return True

    async def contains(self, key: str) -> bool:
        self._check_open()
        validate_key(key, tier=self.name)
        return key in self._blocks

    async def scan(self) -> list[BlockInfo]:
        self._check_open()
        return [BlockInfo(k, n, tag) for k, (n, tag) in self._blocks.items()]

    def stats(self) -> BackendStats:
        return BackendStats(
            tier=self.name,
            kind=TierKind.REMOTE,
            capacity_bytes=self._capacity,
            used_bytes=self._used,
            blocks=len(self._blocks),
            reserved_bytes=self._reserved,
            io_path=f"redis-py (sync client in worker threads) to {self._host}:{self._port}",
            emulated=False,
            details={"spawned_server": self._spawn, "prefix": self._prefix},
            **self._n,
        )

    # ------------------------------------------------------- tierkv certify hook
    async def raw_reference(self, op: str, block_bytes: int, count: int, concurrency: int) -> RawMeasurement:
        """Plain-client SET/GET of ``count`` values of ``block_bytes`` (``SupportsRawReference``)."""
        self._check_open()
        client = self._c
        keys = [f"{self._prefix}raw:{i}" for i in range(count)]
        value = os.urandom(block_bytes)
        if op == "read":
            await self._run(lambda: client.mset({k: value for k in keys}), "raw setup")
        it = iter(keys)
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    k = next(it, None)
                if k is None:
                    return
                if op == "write":
                    client.set(k, value)
                else:
                    client.get(k)

        def run() -> float:
            threads = [threading.Thread(target=worker) for _ in range(concurrency)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return time.perf_counter() - t0

        try:
            dt = await self._run(run, "raw reference")
        finally:
            with anyio.CancelScope(shield=True):
                await self._run(lambda: client.delete(*keys), "raw cleanup")
        return RawMeasurement(block_bytes * count, dt, f"redis-py SET/GET, {concurrency} threads")
