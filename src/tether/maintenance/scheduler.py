"""The scheduler: every worker records its app's schedules; the maintenance leader
enqueues one job per tick of every schedule recorded, whichever worker declared it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from tether import metrics
from tether.config import DEFAULT_BACKOFF, LoopBackoff
from tether.errors import ConfigError
from tether.job import Job, NewJob
from tether.maintenance.leader import Duty, LeaderElection
from tether.new_job import declarations
from tether.ops import ScheduleRow
from tether.periodic import Schedule
from tether.store.protocols import JobStore, ScheduleStore

if TYPE_CHECKING:
    from tether.host import Host

log = logging.getLogger("tether.scheduler")


class SchedulerStore(JobStore, ScheduleStore, Protocol):
    """What the scheduler touches: the schedules, and the jobs it enqueues for them."""


class Scheduler(Duty):
    """Each round, on every worker, first records the app's schedules in the database
    if that is still to do (:meth:`register`); then, on the maintenance leader only, for
    every schedule in the database, enqueues the ticks that came due since its
    ``last_tick`` under its missed-tick policy, and moves ``last_tick`` forward.

    The leader fires schedules it has no code for (another kind of worker, or a newer
    release, declared them): the recorded definition holds the job as the declaring
    worker built and checked it. Every tick up to ``grace`` late is enqueued, in one
    bulk enqueue of at most :data:`~tether.periodic.MAX_FIRE` per schedule and round;
    older ones are skipped, counted and logged.

    Exactly one job per tick, whoever runs it: the job's idempotency key names the
    schedule and the tick, so a second scheduler (two leaders overlapping, a round
    interrupted between the enqueue and the bookkeeping) gets the same job back, and
    ``last_tick`` only moves forward. Time is the database's unless a ``clock`` is given
    (tests pass one to move time by hand).
    """

    name = "scheduler"

    def __init__(
        self,
        app: Host,
        store: SchedulerStore,
        *,
        interval: float,
        leader: LeaderElection | None = None,
        holder: str | None = None,
        clock: Callable[[], datetime] | None = None,
        backoff: LoopBackoff = DEFAULT_BACKOFF,
    ) -> None:
        super().__init__(interval, leader=leader, backoff=backoff, logger=log)
        self.app = app
        self.store = store
        self.holder = holder
        self.clock = clock
        # The names still to record (None: not tried yet).
        self._pending: set[str] | None = None
        # Each definition read from the database, parsed once: name -> (text, parsed).
        self._loaded: dict[str, tuple[str, tuple[Schedule, NewJob] | None]] = {}

    def due(self) -> bool:
        """Every worker's rounds run: recording the app's schedules is every worker's
        (firing them is the leader's alone, see :meth:`run_once`)."""
        return True

    async def _now(self) -> datetime:
        return self.clock() if self.clock is not None else await self.store.db_time()

    async def register(self) -> list[str]:
        """Record this app's schedules (or those a locked row kept out last time);
        returns the names still pending. The newest declaration of a name wins: a
        different definition recorded earlier is replaced, with a warning."""
        if self._pending is None:
            self._pending = set(self.app.schedules.declared)
        declared = declarations(
            self.app.tasks,
            self.app.schedules.declared,
            max_payload_bytes=self.app.config.max_payload_bytes,
        )
        wanted = [d for d in declared if d.name in self._pending]
        if not wanted:
            return []
        done = await self.store.register_schedules(wanted, await self._now(), self.holder)
        for old in done.replaced:
            log.warning(
                "schedule %s: this worker's definition (task %s, cron %r, tz %s) replaces "
                "the one worker %s recorded at %s (task %s, cron %r, tz %s); the newest "
                "declaration wins, so run one definition per name on all workers",
                old.name,
                self.app.schedules.declared[old.name].task,
                self.app.schedules.declared[old.name].cron,
                self.app.schedules.declared[old.name].timezone,
                old.defined_by or "?",
                old.defined_at.isoformat() if old.defined_at else "?",
                old.task,
                old.cron,
                old.timezone,
            )
        self._pending = set(done.pending)
        if done.pending:
            log.info("schedules %s are locked by someone; recorded later", sorted(done.pending))
        return sorted(self._pending)

    async def run_once(self) -> list[Job]:
        """One round; returns the jobs enqueued (``[]`` when not the leader)."""
        if self.app.schedules.declared and (self._pending is None or self._pending):
            await self.register()
        if not self.leads():
            return []
        rows = await self.store.list_schedules()
        if not rows:
            return []
        now = await self._now()
        jobs = []
        for row in rows:
            loaded = self._load(row)
            if loaded is not None:
                jobs.extend(await self._tick(*loaded, row, now))
        return jobs

    def _load(self, row: ScheduleRow) -> tuple[Schedule, NewJob] | None:
        """The schedule and job template a row's definition holds (parsed once)."""
        text = row.definition
        if text is None:
            if row.name not in self._loaded:
                self._loaded[row.name] = ("", None)
                log.warning(
                    "schedule %s has no recorded definition (an older version wrote it); "
                    "it fires once a worker that declares it starts",
                    row.name,
                )
            return None
        cached = self._loaded.get(row.name)
        if cached is None or cached[0] != text:
            try:
                parsed: tuple[Schedule, NewJob] | None = Schedule.load(row.name, text)
            except ConfigError as exc:
                log.warning("schedule %s is not fired: %s", row.name, exc)
                parsed = None
            cached = self._loaded[row.name] = (text, parsed)
        return cached[1]

    async def _tick(
        self, schedule: Schedule, template: NewJob, row: ScheduleRow, now: datetime
    ) -> list[Job]:
        due = schedule.due(row.last_tick or now, now)
        if due.last is None:
            return []
        jobs: list[Job] = []
        if row.paused:
            log.info(
                "schedule %s is paused: %d tick(s) up to %s skipped",
                schedule.name,
                len(due.fire) + due.skipped,
                due.last.isoformat(),
            )
        elif due.fire:
            # One transaction for every tick due: each keeps its own idempotency key.
            jobs = await self.store.enqueue([schedule.job(template, t) for t in due.fire])
            metrics.SCHEDULED.inc(len(jobs))
            log.info(
                "schedule %s: %d tick(s) up to %s enqueued (last job %d)",
                schedule.name,
                len(jobs),
                due.fire[-1].isoformat(),
                jobs[-1].id,
            )
        if due.skipped and not row.paused:
            metrics.SCHEDULE_TICKS_SKIPPED.inc(due.skipped)
            log.warning(
                "schedule %s: %d tick(s) before %s passed more than %.0fs late (no "
                "scheduler ran); skipped (missed=%s)",
                schedule.name,
                due.skipped,
                (due.fire[0] if due.fire else due.last).isoformat(),
                schedule.grace,
                schedule.missed,
            )
        if due.more:
            log.info("schedule %s: more ticks due; the next round enqueues them", schedule.name)
        await self.store.advance_schedule(
            schedule.name,
            due.last,
            schedule.next_tick(due.last),
            jobs[-1].id if jobs else None,
        )
        return jobs
