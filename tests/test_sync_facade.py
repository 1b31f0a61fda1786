"""The synchronous facade (``TierKV.open_sync`` / ``SyncTierKV``): the async core on a
background event-loop thread, driven from plain threads, under both loop backends."""

from __future__ import annotations

import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from kvtest import BT, config, kv_for

from tierkv import ClosedError, KVLayoutError, SyncTierKV, TierKV, TokensError

BACKENDS = ["asyncio", "trio"]


def toks(fam: int, n: int) -> list[int]:
    return [fam * 10_000 + i for i in range(n)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_from_a_plain_thread(tmp_path: Path, backend: str) -> None:
    with TierKV.open_sync(config(tmp_path), backend=backend) as kv:  # type: ignore[arg-type]
        data = kv_for(3 * BT, seed=1)
        assert kv.put(toks(1, 3 * BT), data).new_blocks == 3
        assert kv.lookup(toks(1, 3 * BT)).tokens == 3 * BT
        got = kv.get(toks(1, 3 * BT))
        assert got.tokens == 3 * BT and np.asarray(got.kv).tobytes() == data.tobytes()
        out = np.zeros_like(data)
        assert kv.get(toks(1, 3 * BT), out=out).tokens == 3 * BT
        assert out.tobytes() == data.tobytes()
        kv.hint(response_tokens=5)
        assert set(kv.stats()) == {"dram", "pfs"}
        assert kv.invalidate() == 3
        assert kv.lookup(toks(1, 3 * BT)).tokens == 0
        assert kv.failed_jobs == 0 and kv.invariant_violations(quiescent=False) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_raises_the_typed_error_and_stores_nothing(tmp_path: Path, backend: str) -> None:
    with SyncTierKV.open(config(tmp_path), backend=backend) as kv:  # type: ignore[arg-type]
        with pytest.raises(KVLayoutError):
            kv.put(toks(2, 2 * BT), kv_for(BT))  # KV for half the tokens
        with pytest.raises(TokensError):
            kv.lookup("not tokens")
        assert kv.lookup(toks(2, 2 * BT)).tokens == 0
        assert all(s.blocks == 0 for s in kv.stats().values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_threads_at_once(tmp_path: Path, backend: str) -> None:
    """Eight threads put and read back their own families concurrently; every byte returned
    is what was put, and the store is sound afterwards."""
    with TierKV.open_sync(config(tmp_path, dram="2MiB"), backend=backend) as kv:  # type: ignore[arg-type]

        def worker(w: int) -> int:
            ok = 0
            for r in range(6):
                fam = w * 100 + r
                data = kv_for(2 * BT, seed=fam)
                kv.put(toks(fam, 2 * BT), data)
                g = kv.get(toks(fam, 2 * BT))
                if g.tokens:
                    assert np.asarray(g.kv)[:, :, : g.tokens].tobytes() == data[:, :, : g.tokens].tobytes()
                    ok += 1
            return ok

        with ThreadPoolExecutor(8) as ex:
            hits = sum(ex.map(worker, range(8)))
        assert hits > 0
        assert kv.failed_jobs == 0
        assert kv.invariant_violations(quiescent=False) == []


def test_close_is_idempotent_and_calls_after_it_are_typed_errors(tmp_path: Path) -> None:
    kv = TierKV.open_sync(config(tmp_path))
    kv.put(toks(3, BT), kv_for(BT), durable=True)
    kv.close()
    kv.close()
    assert kv.closed
    with pytest.raises(ClosedError):
        kv.lookup(toks(3, BT))
    with pytest.raises(ClosedError):
        _ = kv.aio
    # persistent tiers keep the block: a new facade over the same directories warm-starts
    with TierKV.open_sync(config(tmp_path, dram=None)) as again:
        assert again.lookup(toks(3, BT)).tokens == BT


def test_a_dropped_facade_stops_its_thread_and_frees_the_store(tmp_path: Path) -> None:
    before = threading.active_count()
    kv = TierKV.open_sync(config(tmp_path))
    kv.put(toks(4, BT), kv_for(BT))
    store = weakref.ref(kv.aio)
    assert threading.active_count() > before
    del kv
    gc.collect()
    assert threading.active_count() == before
    assert store() is None


def test_a_failed_open_leaves_no_thread_behind(tmp_path: Path) -> None:
    before = threading.active_count()
    with pytest.raises(Exception, match="tiers"):
        TierKV.open_sync({**config(tmp_path), "tiers": []})
    assert threading.active_count() == before


def test_call_runs_a_coroutine_on_the_loop(tmp_path: Path) -> None:
    with TierKV.open_sync(config(tmp_path)) as kv:

        async def put_then_lookup(n: int) -> int:
            await kv.aio.put(toks(5, n), kv_for(n))
            return (await kv.aio.lookup(toks(5, n))).tokens

        assert kv.call(put_then_lookup, 2 * BT) == 2 * BT


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_lets_calls_in_flight_finish_and_later_calls_fail_typed(tmp_path: Path, backend: str) -> None:
    """Threads keep calling while another closes: each call either completes (with a right
    answer) or raises ClosedError; close returns, nothing hangs, the store is consistent."""
    kv = TierKV.open_sync(config(tmp_path), backend=backend)  # type: ignore[arg-type]
    data = kv_for(2 * BT, seed=4)
    kv.put(toks(4, 2 * BT), data)
    outcomes: list[str] = []
    started = threading.Barrier(5)

    def worker() -> None:
        started.wait()
        for _ in range(200):
            try:
                got = kv.get(toks(4, 2 * BT))
            except ClosedError:
                outcomes.append("closed")
                return
            assert got.tokens == 2 * BT and np.asarray(got.kv).tobytes() == data.tobytes()
            outcomes.append("ok")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait()
    kv.close()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert kv.closed and outcomes.count("closed") <= 4
    with pytest.raises(ClosedError):
        kv.lookup(toks(4, BT))


def test_a_call_from_the_loop_thread_itself_is_refused(tmp_path: Path) -> None:
    with TierKV.open_sync(config(tmp_path)) as kv:
        with pytest.raises(RuntimeError, match="own event-loop thread"):
            kv.call(lambda: kv.lookup(toks(1, BT)))  # runs on the loop, which would wait on itself
        assert kv.lookup(toks(1, BT)).tokens == 0
