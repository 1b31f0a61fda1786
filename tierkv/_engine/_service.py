"""The scheduler service: background placement jobs and health probes.

Owns: the job queue (jobs are frozen dataclasses, deduplicated while queued), the
task group that runs them (each tier runs at most ``max_transfers_per_tier``
transfers at once), and the probe loop that lets an unhealthy tier's breaker close
again. A job that fails is counted (``failed_jobs``), logged with its cause and
traced; the service goes on. Cancelling the service stops it: jobs in flight finish
their current block (relocations are shielded), queued ones are dropped.

May not touch: what a job does (the mover decides), the put/get paths.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from ..errors import SchedulerError, TierKVError

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["Job", "Promote", "Rebalance", "Reserve", "Service"]

log = logging.getLogger("tierkv")


@dataclass(frozen=True, slots=True)
class Rebalance:
    """Shed every tier past its high watermark down to its low watermark."""


@dataclass(frozen=True, slots=True)
class Promote:
    """Copy block ``key`` up to tier ``dst`` if there is room (``prefetch``: ahead of need)."""

    key: str
    dst: int
    prefetch: bool = False


@dataclass(frozen=True, slots=True)
class Reserve:
    """Make ``nbytes`` of room in the fastest tier (a predicted tool switch)."""

    nbytes: int


Job = Rebalance | Promote | Reserve


class Service:
    """Runs placement jobs in the background (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s
        self.jobs: MemoryObjectSendStream[Job] | None = None
        self.pending: set[Job] = set()
        #: set when ``pending`` empties (made by a waiting :meth:`drain`)
        self._idle: anyio.Event | None = None

    @property
    def running(self) -> bool:
        return self.jobs is not None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled (see :meth:`tierkv.TierKV.run_scheduler`)."""
        self.s.check_open()
        if self.jobs is not None:
            raise SchedulerError("the scheduler service is already running for this TierKV")
        send, recv = anyio.create_memory_object_stream[Job](self.s.sched.queue_size)
        try:
            async with anyio.create_task_group() as tg, recv:
                self.jobs = send
                tg.start_soon(self.probe_loop)
                task_status.started()
                async for job in recv:
                    tg.start_soon(self.run_job, job)
                tg.cancel_scope.cancel()
        finally:
            self.jobs = None
            self.pending.clear()
            if self._idle is not None:
                self._idle.set()
            send.close()

    async def drain(self) -> None:
        """Return once no job is queued or running (at once when the service is not running)."""
        while self.pending:
            if self._idle is None or self._idle.is_set():
                self._idle = anyio.Event()
            await self._idle.wait()

    def _done(self, job: Job) -> None:
        self.pending.discard(job)
        if not self.pending and self._idle is not None:
            self._idle.set()

    def submit(self, job: Job) -> None:
        """Queue a background job (deduplicated); drop it, counted, if the queue is full.
        A no-op while the service is not running."""
        if self.jobs is None or job in self.pending:
            return
        try:
            self.jobs.send_nowait(job)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.s.sched.dropped_jobs += 1
            return
        self.pending.add(job)

    async def run_job(self, job: Job) -> None:
        s = self.s
        try:
            if isinstance(job, Rebalance):
                await s.mover.rebalance()
            elif isinstance(job, Promote):
                e = s.index.entries.get(job.key)
                if e is None or e.tier <= job.dst or not s.tiers[job.dst].healthy:
                    return
                async with s.tiers[e.tier].limiter, s.tiers[job.dst].limiter:
                    await s.mover.promote_if_room(e, job.dst, "prefetch" if job.prefetch else "value")
            else:
                await s.mover.make_room(0, job.nbytes)
        except Exception as exc:  # a failed background job never kills the service
            s.failed_jobs += 1
            name = type(job).__name__
            log.warning("tierkv: background job %s failed: %s: %s", name, type(exc).__name__, exc, exc_info=exc)
            s.tel.decision("job_failed", {"tierkv.job": name, "tierkv.reason": f"{type(exc).__name__}: {exc}"[:200]})
        finally:
            self._done(job)

    async def probe_loop(self) -> None:
        """Probe unhealthy tiers once their breaker's cooldown has passed."""
        tiers = self.s.tiers
        while True:
            await anyio.sleep(max(0.05, min(1.0, min((t.breaker.cooldown_s for t in tiers), default=1.0) / 2)))
            for ti, t in enumerate(tiers):
                if t.healthy or not t.breaker.allow():
                    continue
                try:
                    with anyio.fail_after(5):
                        await t.backend.contains("tierkv-probe")
                except (TierKVError, TimeoutError) as exc:
                    self.s.tier_failed(ti, exc)
                else:
                    t.breaker.record_success()
                    if t.healthy:
                        self.s.tel.decision("tier_healthy", {"tierkv.tier": t.name, "tierkv.reason": "probe succeeded"})
