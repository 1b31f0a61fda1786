"""A tierkv backend storing blocks on a Redis server, written against ``tierkv.backend`` alone.

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

Design: the synchronous ``redis`` client runs in worker threads
(:func:`tierkv.backend.run_blocking` with a limiter), so the backend works under
asyncio and trio alike. Reservations and capacity are kept by a
:class:`tierkv.backend.ReservationLedger`. A block is the Redis string
``<prefix>b:<key>`` holding its bytes as they are (sent from the caller's buffer
without a copy), and a field of the tier's index hash ``<prefix>index``
(``magic | nbytes | tag``). A batch of blocks is one pipeline: the SETs, then one
HSET of their index fields, so a block is listed only once its bytes are stored
(a crash in between leaves an unlisted string, never a listed torn block); on a
private server (``spawn_server``) nobody else reads the index, so there is none. Reads
and evicts of a batch are one pipeline too. Other instances with the same prefix
see committed blocks (shared=True) and rebuild their accounting from the index on
open. A block lost by the server (its own maxmemory eviction) is reported as
BlockNotFoundError; one whose stored length is not its listed size as IntegrityError.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import anyio.to_thread
import numpy as np
import redis

from tierkv.backend import (
    Allocation,
    Availability,
    Backend,
    BackendStats,
    BlockInfo,
    Buffer,
    Capabilities,
    RawMeasurement,
    Reservation,
    ReservationLedger,
    TierKind,
    as_byte_view,
    certify_batch,
    into_view,
    opt_bool,
    opt_int,
    opt_size,
    opt_str,
    reject_unknown,
    run_blocking,
    validate_key,
)
from tierkv.errors import (
    BackendIOError,
    BlockNotFoundError,
    CapacityError,
    InputError,
    IntegrityError,
    PluginUnavailableError,
)

__all__ = ["RedisBackend"]

T = TypeVar("T")
#: an index field: magic, block size, then the tag
_MAGIC = b"TKV2"
_META = struct.Struct("<4sQ")
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
        self._blocks: dict[str, tuple[int, bytes]] = {}  # committed: key -> (nbytes, tag)
        self._ledger: ReservationLedger[Reservation] = ReservationLedger(
            tier=self.name, capacity=self._capacity, max_block_bytes=self._max_block
        )
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

        def connect() -> list[tuple[str, int, bytes]]:
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            listed: list[tuple[str, int, bytes]] = []
            index = cast(dict[bytes, bytes], client.hgetall(self._index))  # decode_responses=False: bytes
            for k, meta in index.items():
                if len(meta) >= _META.size and meta[:4] == _MAGIC:
                    listed.append((k.decode(), _META.unpack_from(meta)[1], bytes(meta[_META.size :])))
            pipe = client.pipeline(transaction=False)
            for key, _, _ in listed:
                pipe.strlen(self._key(key))
            sizes = pipe.execute() if listed else []
            # a listed block whose bytes the server lost (or that is torn) is not ours any more
            return [b for b, size in zip(listed, sizes, strict=True) if size == b[1]]

        try:
            found = await self._run(connect, "connect")
        except BaseException:
            client.close()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._stop_server)
            raise
        self._client = client
        for k, n, tag in found:
            self._blocks[k] = (n, tag)
            self._ledger.restore(n)

    async def _close(self) -> None:
        self._ledger.clear()
        client, self._client = self._client, None
        with anyio.CancelScope(shield=True):
            if client is not None:
                await anyio.to_thread.run_sync(client.close)
            await anyio.to_thread.run_sync(self._stop_server)

    @property
    def _c(self) -> redis.Redis:
        if self._client is None:
            raise BackendIOError("not connected", tier=self.name)
        return self._client

    def _delete_sync(self, keys: Sequence[str]) -> None:
        pipe = self._c.pipeline(transaction=False)
        pipe.delete(*(self._key(k) for k in keys))
        if not self._spawn:
            pipe.hdel(self._index, *keys)
        pipe.execute()

    async def _delete_shielded(self, keys: Sequence[str]) -> None:
        """Remove ``keys`` from the server whatever happens to the caller (best effort:
        a failure leaves strings no index lists)."""
        if keys:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await anyio.to_thread.run_sync(self._delete_sync, keys, limiter=self._limiter)

    # --------------------------------------------------------------------- data
    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        self._check_open()
        return self._ledger.reserve(key, nbytes, tag, committed=self._blocks)

    async def allocate_many(self, items: Sequence[tuple[str, int, bytes]]) -> list[Allocation]:
        self._check_open()
        return self._ledger.reserve_many(items, committed=self._blocks)

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        await self.write_many([allocation], [data])

    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """One pipeline for the batch (SETs, then one HSET of the index). All blocks of
        the batch commit, or none: a failure or cancellation leaves nothing visible and
        releases every reservation of the batch; a block evicted meanwhile is removed
        again and reported (BlockNotFoundError) after the others commit."""
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        self._check_open()
        claimed: list[Reservation] = []
        views: list[memoryview] = []
        try:
            for a, d in zip(allocations, datas, strict=True):
                r = self._ledger.claim(a)
                claimed.append(r)
                mv = as_byte_view(d)
                if len(mv) != r.nbytes:
                    raise InputError(f"[{self.name}] write of {len(mv)} bytes into a {r.nbytes}-byte allocation")
                views.append(mv)
        except BaseException:
            self._release(allocations, claimed)
            raise
        if not claimed:
            return
        client = self._c

        def commit() -> None:
            pipe = client.pipeline(transaction=False)
            for r, mv in zip(claimed, views, strict=True):
                pipe.set(self._key(r.key), mv)  # the caller's bytes, sent without a copy
            if not self._spawn:  # a private server has no other reader, and dies with this instance
                pipe.hset(self._index, mapping={r.key: _META.pack(_MAGIC, r.nbytes) + r.tag for r in claimed})
            pipe.execute()

        try:
            await self._run(commit, f"write of {len(claimed)} block(s)")
        except BaseException:
            # failed or cancelled: some of it may have run; make sure nothing stays visible
            self._release(allocations, claimed)
            await self._delete_shielded([r.key for r in claimed])
            raise
        dropped = [r.key for r in claimed if not self._ledger.commit(r)]  # evicted (or closed) meanwhile
        for r in claimed:
            if r.key not in dropped:
                self._blocks[r.key] = (r.nbytes, r.tag)
                self._n["writes"] += 1
                self._n["bytes_written"] += r.nbytes
        if dropped:
            await self._delete_shielded(dropped)
            raise BlockNotFoundError(f"reservation for {dropped[0]!r} was dropped during write", tier=self.name)

    def _release(self, allocations: Sequence[Allocation], claimed: list[Reservation]) -> None:
        """Release the reservations of a batch that does not commit."""
        for r in claimed:
            self._ledger.abort(r)
        self._ledger.drop_unclaimed(allocations)

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        return (await self.read_many([key], into=None if into is None else [into]))[0]

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """One pipeline of GETs for the batch; the first failing block raises."""
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        self._check_open()
        entries: list[tuple[int, bytes]] = []
        for k in keys:
            validate_key(k, tier=self.name)
            entry = self._blocks.get(k)
            if entry is None:
                raise BlockNotFoundError(f"no block {k!r}", tier=self.name)
            entries.append(entry)
        outs = [into_view(d, e[0], tier=self.name) for d, e in zip(into, entries, strict=True)] if into else None
        if not keys:
            return []
        client = self._c

        def fetch() -> list[bytes | None]:
            pipe = client.pipeline(transaction=False)
            for k in keys:
                pipe.get(self._key(k))
            return list(pipe.execute())

        # abandonable: the replies are copied into ``into`` here, after the thread returned
        raws = await self._run(fetch, f"read of {len(keys)} block(s)", abandon=True)
        result: list[memoryview] = []
        for i, (k, entry, raw) in enumerate(zip(keys, entries, raws, strict=True)):
            if raw is None:
                if self._blocks.get(k) is entry:  # lost by the server itself
                    del self._blocks[k]
                    self._ledger.release(entry[0])
                raise BlockNotFoundError(f"block {k!r} is gone from the server", tier=self.name)
            if len(raw) != entry[0]:
                raise IntegrityError(f"block {k!r}: {len(raw)} bytes stored, {entry[0]} listed", tier=self.name)
            if outs is not None:
                outs[i][:] = raw
                result.append(outs[i])
            else:
                result.append(memoryview(bytearray(raw)))
        self._n["reads"] += len(keys)
        self._n["bytes_read"] += sum(e[0] for e in entries)
        return result

    async def evict(self, key: str) -> bool:
        return (await self.evict_many([key]))[0]

    async def evict_many(self, keys: Sequence[str]) -> list[bool]:
        """The keys leave at once; one pipeline (shielded) removes them from the server."""
        self._check_open()
        for k in keys:
            validate_key(k, tier=self.name)
        out: list[bool] = []
        gone: list[str] = []
        for k in keys:
            if self._ledger.drop(k) is not None:  # a write in flight removes its own bytes
                out.append(True)
                continue
            entry = self._blocks.pop(k, None)
            out.append(entry is not None)
            if entry is not None:
                self._ledger.release(entry[0])
                gone.append(k)
        if gone:
            self._n["evictions"] += len(gone)
            with anyio.CancelScope(shield=True):
                await self._run(lambda: self._delete_sync(gone), f"evict of {len(gone)} block(s)")
        return out

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
            used_bytes=self._ledger.used_bytes,
            blocks=len(self._blocks),
            reserved_bytes=self._ledger.reserved_bytes,
            io_path=f"redis-py (sync client in worker threads, a pipeline per batch) to {self._host}:{self._port}",
            emulated=False,
            details={"spawned_server": self._spawn, "prefix": self._prefix},
            **self._n,
        )

    # ------------------------------------------------------- tierkv certify hook
    async def raw_reference(self, op: str, block_bytes: int, count: int, concurrency: int) -> RawMeasurement:
        """The plain client (``SupportsRawReference``): ``count`` values of ``block_bytes``
        SET or GET in the envelope's batches (one pipeline each, :func:`certify_batch`),
        ``concurrency`` threads each taking the next batch; no index, no checks, no copy.
        Writes send from a ring of a batch's worth of distinct buffers per thread: the
        memory the envelope's tasks write from on the backend's side."""
        self._check_open()
        client = self._c
        keys = [f"{self._prefix}raw:{i}" for i in range(count)]
        per = certify_batch(block_bytes, count)
        batches = [keys[i : i + per] for i in range(0, count, per)]
        rng = np.random.default_rng(count)
        rings = [
            [rng.integers(0, 256, block_bytes, dtype=np.uint8).tobytes() for _ in range(per if op == "write" else 1)]
            for _ in range(concurrency)
        ]
        if op == "read":
            await self._run(lambda: client.mset(dict.fromkeys(keys, rings[0][0])), "raw setup")
        it = iter(batches)
        lock = threading.Lock()

        def worker(ring: list[bytes]) -> None:
            while True:
                with lock:
                    batch = next(it, None)
                if batch is None:
                    return
                pipe = client.pipeline(transaction=False)
                for j, k in enumerate(batch):
                    if op == "write":
                        pipe.set(k, ring[j % len(ring)])
                    else:
                        pipe.get(k)
                pipe.execute()

        def run() -> float:
            threads = [threading.Thread(target=worker, args=(rings[w],)) for w in range(concurrency)]
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
        return RawMeasurement(
            block_bytes * count, dt, f"redis-py pipelined SET/GET, {per} per batch, {concurrency} threads"
        )
