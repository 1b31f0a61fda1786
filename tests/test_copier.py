"""The DRAM tier's copy helper (tierkv_backends._copier.Copier): both threads copy, a cancel stops
both at a piece boundary and returns only once the helper's piece is done, errors cross threads,
the helper thread ends with ``aclose`` (or when the copier is dropped)."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

from tierkv_backends._copier import Copier

pytestmark = pytest.mark.anyio


def _pieces(n: int, size: int = 1 << 16) -> tuple[list[tuple[Any, Any, int]], np.ndarray[Any, Any]]:
    src = np.arange(n * size, dtype=np.uint8).reshape(n, size)
    dst = np.zeros_like(src)
    return [(src[i], dst[i], size) for i in range(n)], dst


async def test_every_piece_is_copied_once_and_both_threads_copy() -> None:
    pieces, dst = _pieces(64)
    who: list[str] = []
    lock = threading.Lock()

    def one(a: Any, v: Any) -> None:
        time.sleep(0.001)  # slow pieces: the helper is sure to start before the loop is done
        np.copyto(v, a)
        with lock:
            who.append(threading.current_thread().name)

    c = Copier()
    try:
        await c.run(pieces, one, 1 << 16)
        assert np.array_equal(dst, np.stack([a for a, _, _ in pieces]))
        assert len(who) == 64
        assert "tierkv-copier" in who and threading.current_thread().name in who
    finally:
        await c.aclose()


async def test_a_cancel_stops_both_threads_and_nothing_is_written_after_the_return() -> None:
    """Cancelled at random points: the call returns only when no piece is being copied (a piece
    started by either thread finishes, none starts after), and the cancel is raised."""
    c = Copier()
    try:
        for delay in (0.0, 0.0005, 0.002, 0.005, 0.02):
            pieces, _ = _pieces(40)
            started = [0]
            running = [0]
            lock = threading.Lock()

            def one(
                a: Any, v: Any, started: list[int] = started, running: list[int] = running, lock: Any = lock
            ) -> None:
                with lock:
                    started[0] += 1
                    running[0] += 1
                time.sleep(0.0005)
                np.copyto(v, a)
                with lock:
                    running[0] -= 1

            with anyio.move_on_after(delay) as scope:
                await c.run(pieces, one, 1)
            if scope.cancelled_caught:
                assert running[0] == 0
                seen = started[0]
                assert seen < 40
                await anyio.sleep(0.01)
                assert started[0] == seen and running[0] == 0  # nothing started after the return
            else:
                assert started[0] == 40
    finally:
        await c.aclose()


async def test_an_error_on_the_helper_thread_is_raised_by_run() -> None:
    pieces, _ = _pieces(32)

    def one(a: Any, v: Any) -> None:
        if threading.current_thread().name == "tierkv-copier":
            raise ValueError("bad piece")
        time.sleep(0.001)
        np.copyto(v, a)

    c = Copier()
    try:
        with pytest.raises(ValueError, match="bad piece"):
            await c.run(pieces, one, 1 << 16)
        # the copier still works afterwards
        ok, dst = _pieces(4)
        await c.run(ok, lambda a, v: np.copyto(v, a), 1 << 16)
        assert np.array_equal(dst, np.stack([a for a, _, _ in ok]))
    finally:
        await c.aclose()


async def test_a_job_the_loop_finished_alone_does_not_wait_for_the_helper() -> None:
    """The helper busy elsewhere (another job's slow piece): a second job's loop side copies
    everything itself and returns without waiting for the helper."""
    c = Copier()
    gate = threading.Event()
    held = threading.Event()
    slow, _ = _pieces(20)

    def first(a: Any, v: Any) -> None:
        if threading.current_thread().name == "tierkv-copier":
            held.set()
            gate.wait(5)  # the helper is held in the first job's piece
        else:
            time.sleep(0.002)

    try:
        async with anyio.create_task_group() as tg:

            async def blocker() -> None:
                await c.run(slow, first, 1)

            tg.start_soon(blocker)
            assert await anyio.to_thread.run_sync(held.wait, 5)
            pieces, dst = _pieces(8)
            t0 = time.perf_counter()
            with anyio.fail_after(2):
                await c.run(pieces, lambda a, v: np.copyto(v, a), 1 << 30)
            assert time.perf_counter() - t0 < 1.0
            assert np.array_equal(dst, np.stack([a for a, _, _ in pieces]))
            gate.set()
    finally:
        gate.set()
        await c.aclose()


async def test_aclose_ends_the_helper_thread_and_a_dropped_copier_ends_it_too() -> None:
    def copiers() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "tierkv-copier")

    before = copiers()
    c = Copier()
    pieces, _ = _pieces(8)
    await c.run(pieces, lambda a, v: np.copyto(v, a), 1)
    assert copiers() == before + 1
    await c.aclose()
    await c.aclose()  # idempotent
    assert copiers() == before
    d = Copier()
    await d.run(pieces, lambda a, v: np.copyto(v, a), 1)
    assert copiers() == before + 1
    del d
    gc.collect()
    for _ in range(200):
        if copiers() == before:
            break
        await anyio.sleep(0.01)
    assert copiers() == before
