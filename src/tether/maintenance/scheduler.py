"""The scheduler: enqueues one job per tick of every periodic schedule."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from tether import metrics
from tether.job import Job
from tether.maintenance.leader import LeaderElection
from tether.periodic import Schedule
from tether.service import Service
from tether.store.protocols import JobStore, ScheduleStore
from tether.task import EnqueueOptions

if TYPE_CHECKING:
    from tether.app import App

log = logging.getLogger("tether.scheduler")


class SchedulerStore(JobStore, ScheduleStore, Protocol):
    """What the scheduler touches: the schedules, and the jobs it enqueues for them."""


class Scheduler(Service):
    """Each round, for every schedule of the app, finds the ticks that came due since
    its ``last_tick`` and enqueues the latest one (under the schedule's missed-tick
    policy), then moves ``last_tick`` forward.

    Exactly one job per tick, whoever runs it: the job's idempotency key names the
    schedule and the tick, so a second scheduler (two leaders overlapping, a round
    interrupted between the enqueue and the bookkeeping) gets the same job back, and
    ``last_tick`` only moves forward. Time is the database's unless a ``clock`` is given
    (tests pass one to move time by hand).
    """

    name = "scheduler"

    def __init__(
        self,
        app: App,
        store: SchedulerStore,
        *,
        interval: float,
        leader: LeaderElection | None = None,
        clock: Callable[[], datetime] | None = None,
        max_consecutive_errors: int = 3,
        max_backoff: float = 30.0,
    ) -> None:
        super().__init__(
            interval,
            max_consecutive_errors=max_consecutive_errors,
            max_backoff=max_backoff,
            logger=log,
        )
        self.app = app
        self.store = store
        self.leader = leader
        self.clock = clock
        self._synced: dict[str, Schedule] = {}

    async def run_once(self) -> list[Job]:
        """One round; returns the jobs enqueued (``[]`` when not the leader)."""
        schedules = self.app.schedules
        if not schedules or (self.leader is not None and not self.leader.leading):
            return []
        now = self.clock() if self.clock is not None else await self.store.db_time()
        rows = {row.name: row for row in await self.store.list_schedules()}
        jobs = []
        for name, schedule in schedules.items():
            row = rows.get(name)
            if row is None or self._synced.get(name) != schedule:
                # New here, or its definition changed: record it (a new one starts now).
                row = await self.store.sync_schedule(
                    name, schedule.task, schedule.cron, schedule.timezone, now
                )
                self._synced[name] = schedule
            job = await self._tick(schedule, row.last_tick or now, row.paused, now)
            if job is not None:
                jobs.append(job)
        return jobs

    async def _tick(
        self, schedule: Schedule, last: datetime, paused: bool, now: datetime
    ) -> Job | None:
        tick, count = schedule.due(last, now)
        if tick is None:
            return None
        following = schedule.next_tick(tick)
        job = None
        if paused:
            log.info("schedule %s is paused: tick %s skipped", schedule.name, tick.isoformat())
        elif schedule.fires(tick, now):
            opts = EnqueueOptions(
                queue=schedule.queue, idempotency_key=schedule.key(tick), delay=schedule.delay()
            )
            new = self.app.new_job(schedule.task, dict(schedule.args), opts)
            [job] = await self.store.enqueue([new])
            metrics.SCHEDULED.inc()
            log.info("schedule %s: tick %s enqueued job %d", schedule.name, tick, job.id)
        if count > 1 or (job is None and not paused):
            missed = count - (1 if job is not None else 0)
            log.warning(
                "schedule %s: %d tick(s) up to %s passed while no scheduler ran; "
                "skipped (missed=%s)",
                schedule.name,
                missed,
                tick.isoformat(),
                schedule.missed,
            )
        await self.store.advance_schedule(
            schedule.name, tick, following, job.id if job is not None else None
        )
        return job
