"""Copies shared between the event-loop thread and one helper thread (the DRAM tier's ``split``).

Owns: :data:`CPUS` (the CPUs this process may run on) and :class:`Copier` -- one helper thread per backend that uses it (started on first use, stopped
by :meth:`Copier.aclose` or when the copier is garbage-collected; it holds no reference to the
backend) -- and :meth:`Copier.run`, which copies a list of *pieces* (numpy copies that release the
GIL) on both threads at once: the loop's own thread claims pieces from the front, the helper from the
back, until none is left.

Why a dedicated thread and claims from both ends, not ``anyio.to_thread`` and a fixed half each: a job is
handed to the helper by a queue (it wakes in ~40 us on the 2-vCPU development VM), while an
``anyio.to_thread`` call needs several event-loop iterations before its thread is even asked to
start -- and the loop's thread, busy copying its half, only turns the loop between pieces: the
worker started 0.5-0.9 ms late for every batch, which cost a 377 MB put in 32 MiB batches ~12 ms.
The loop's side takes pieces from the front and the helper from the back until they meet, so a late
or descheduled helper never leaves the loop waiting for a fixed half, and each thread still works
through one contiguous region (two threads faulting in pages of the same region, as interleaved
pieces would make them, contend in the kernel: a ``get()`` into new memory took 84 instead of 56 ms).

Cancellation: a cancel delivered at one of the loop side's checkpoints (one every ``budget``
bytes it copies) halts the job: the helper stops at the end of its current piece, the loop
waits for that (shielded: the caller's memory is written until then), and the cancel is
re-raised. A job whose pieces the loop copied alone does not wait for the helper at all.
Errors raised by a piece on the helper thread are re-raised on the loop's thread.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

__all__ = ["CPUS", "Copier"]

#: (caller side, arena side, bytes) of one copy
Piece = tuple[Any, Any, int]

#: the CPUs this process may run on, read once (``os.cpu_count()`` costs microseconds per call): how many
#: memory copies can run at once (the DRAM tier's ``split``, the pfs tier's reads of cached blocks)
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _Job:
    """One :meth:`Copier.run` call's pieces and the state both threads share (under ``lock``)."""

    __slots__ = ("active", "closed", "error", "last", "lock", "next", "one", "pieces")

    def __init__(self, pieces: Sequence[Piece], one: Callable[[Any, Any], None]) -> None:
        self.pieces = pieces
        self.one = one
        self.next = 0  # the loop's side takes pieces from the front
        self.last = len(pieces) - 1  # the helper from the back
        self.lock = threading.Lock()
        self.closed = False  # no piece may be claimed any more (done, halted, or left to the loop)
        self.active = False  # the helper is inside the job
        self.error: BaseException | None = None

    def claim(self) -> int:
        """The index of the next piece for the loop's side (from the front), or -1."""
        with self.lock:
            if self.closed or self.next > self.last:
                return -1
            i = self.next
            self.next += 1
            return i

    def claim_back(self) -> int:
        """The index of the next piece for the helper (from the back), or -1."""
        with self.lock:
            if self.closed or self.next > self.last:
                return -1
            i = self.last
            self.last -= 1
            return i

    def halt(self) -> None:
        with self.lock:
            self.closed = True

    def helper(self) -> None:
        """The helper thread's share: pieces until none is left (or the job is halted)."""
        with self.lock:
            if self.closed:
                return
            self.active = True
        try:
            while (i := self.claim_back()) >= 0:
                a, v, _ = self.pieces[i]
                self.one(a, v)
        except BaseException as exc:  # re-raised on the loop's thread
            self.error = exc
            self.halt()
        finally:
            with self.lock:
                self.active = False

    def release(self) -> bool:
        """Close the job (every piece was claimed); True if the helper is still copying one."""
        with self.lock:
            self.closed = True
            return self.active

    def drop(self) -> None:
        """Let go of the pieces and the copy function (the caller's memory) once no thread will
        touch them again: the job may still wait in the helper's queue behind a busy helper."""
        self.pieces = ()
        self.one = _nothing


def _nothing(a: Any, v: Any) -> None:
    return None


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        job.helper()
        del job  # an idle helper keeps no job (and no caller memory) alive


class Copier:
    """One helper thread sharing copies with the event loop's thread (see the module docstring).

    Safe to use from several tasks at once (jobs queue for the helper; the loop side of each
    copies what the helper has not taken). ``aclose`` is idempotent; a later :meth:`run` starts a
    new helper."""

    __slots__ = ("__weakref__", "_finalizer", "_jobs", "_thread")

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _queue(self) -> queue.SimpleQueue[_Job | None]:
        if self._jobs is None or self._thread is None or not self._thread.is_alive():
            jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
            self._thread = threading.Thread(target=_serve, args=(jobs,), name="tierkv-copier", daemon=True)
            self._thread.start()
            self._jobs = jobs
            # the thread references only its queue: a copier dropped without close still stops it
            self._finalizer = weakref.finalize(self, jobs.put, None)
        return self._jobs

    async def aclose(self) -> None:
        """Stop the helper thread (after the jobs already queued: none still copies, as every
        :meth:`run` waits for its pieces) and join it in a worker thread; idempotent."""
        thread = self._thread
        if self._finalizer is not None:
            self._finalizer()  # puts the stop marker once
        self._jobs = self._thread = self._finalizer = None
        if thread is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(thread.join)

    async def run(self, pieces: Sequence[Piece], one: Callable[[Any, Any], None], budget: int) -> None:
        """Copy every piece with ``one(caller side, arena side)``, on the helper thread and this
        one at once; this thread checkpoints after every ``budget`` bytes it copies. Returns when
        every piece is copied; a cancel stops both threads at their next piece boundary, waits for
        the helper's piece, then is raised (some pieces were not copied: the caller discards the
        destination's contents). An exception from a piece is raised here."""
        job = _Job(pieces, one)
        self._queue().put(job)
        left = budget
        try:
            while (i := job.claim()) >= 0:
                a, v, n = pieces[i]
                one(a, v)
                left -= n
                if left <= 0:
                    left = budget
                    await anyio.lowlevel.checkpoint()
        except GeneratorExit:
            # the coroutine is closed without a running loop (a loop torn down with this task
            # pending): no await is possible; the job keeps the memory the helper's piece writes
            job.halt()
            raise
        except BaseException as exc:
            job.halt()
            with anyio.CancelScope(shield=True):
                await _until_idle(job)
            job.drop()
            if job.error is not None and job.error is not exc:
                exc.__context__ = exc.__context__ or job.error  # the helper's failure is not lost
            raise
        if job.release():
            with anyio.CancelScope(shield=True):  # the helper's last piece is still being written
                await _until_idle(job)
        job.drop()
        if job.error is not None:
            raise job.error
        await anyio.lowlevel.checkpoint_if_cancelled()


async def _until_idle(job: _Job) -> None:
    """Wait (polling, first by bare loop turns) until the helper left ``job``: at most the
    time of the one piece it is copying, unless its thread is descheduled."""
    turns = 0
    while job.active:
        if turns < 64:
            turns += 1
            await anyio.lowlevel.checkpoint()
        else:
            await anyio.sleep(1e-4)
