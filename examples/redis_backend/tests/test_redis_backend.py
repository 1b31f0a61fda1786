"""tierkv-redis runs the tierkv conformance suite against a real redis-server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from tierkv_conformance import BackendConformance, SupportsRawReference
from tierkv_redis import RedisBackend


class TestRedis(BackendConformance):
    """Against the shared session server; each test gets its own key prefix."""

    backend_name = "redis"

    @pytest.fixture
    def backend_options(self, redis_server: tuple[str, int], tmp_path: Path) -> dict[str, Any]:
        host, port = redis_server
        return {"host": host, "port": port, "prefix": f"t{uuid.uuid4().hex[:12]}:", "capacity": "96MiB"}


class TestRedisPrivateServer(BackendConformance):
    """With default_options the backend starts (and stops) its own redis-server."""

    backend_cls = RedisBackend
    cancel_iterations = 20
    stateful_examples = 4


pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_block_lost_by_server_is_not_found(redis_server: tuple[str, int]) -> None:
    host, port = redis_server
    b = await RedisBackend.open({"host": host, "port": port, "prefix": "lost:"})
    try:
        a = await b.allocate("k1", 3)
        await b.write(a, b"abc")
        await anyio.to_thread.run_sync(lambda: redis.Redis(host=host, port=port).delete("lost:b:k1"))
        with pytest.raises(Exception) as ei:
            await b.read("k1")
        assert type(ei.value).__name__ == "BlockNotFoundError"
        assert b.stats().used_bytes == 0
    finally:
        await b.aclose()


async def test_raw_reference(redis_server: tuple[str, int]) -> None:
    host, port = redis_server
    b = await RedisBackend.open({"host": host, "port": port, "prefix": "raw:"})
    try:
        assert isinstance(b, SupportsRawReference)
        m = await b.raw_reference("write", 4096, 16, 2)
        assert m.nbytes == 4096 * 16 and m.seconds > 0
        left = await anyio.to_thread.run_sync(lambda: redis.Redis(host=host, port=port).keys("raw:raw:*"))
        assert left == []
    finally:
        await b.aclose()
