"""Periodic schedules: a task enqueued once per tick of a cron expression.

A schedule is declared in code (``@app.periodic(cron=...)`` or ``app.schedules.declare(...)``).
Every worker records its app's schedules in the database as it starts (see
:meth:`Schedule.stored`), and the maintenance leader's
:class:`~tether.maintenance.scheduler.Scheduler` fires every schedule recorded there,
whichever worker declared it. Each tick's job carries the idempotency key
``schedule:<name>:<tick>``, so however many schedulers look at a tick (two leaders
overlapping, a restart in the middle of a round), it is enqueued once.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from tether import names
from tether.errors import ConfigError
from tether.job import JSON, NewJob

Missed = Literal["none", "latest"]
"""What to do with ticks that passed more than ``grace`` late (no scheduler ran): skip
them (``none``), or enqueue the latest one (``latest``). Ticks up to ``grace`` late are
always enqueued, every one of them."""

DEFAULT_GRACE = 60.0
# The most ticks looked at per round: a per-second schedule after a long outage must not
# make one round walk millions of ticks.
MAX_TICKS = 10_000
# The most ticks of one schedule enqueued per round (in one bulk enqueue): a schedule
# with a long grace and a short period catches up over a few rounds, never in a flood.
MAX_FIRE = 100
# The fields of the job a declaring worker built for a schedule that the leader reuses
# for every tick (the rest of NewJob is per tick or unused by schedules).
_JOB_FIELDS = ("task", "args_json", "queue", "priority", "max_attempts", "timeout", "limits")


@dataclass(frozen=True)
class Due:
    """What one round does with a schedule's ticks after its last tick, up to now."""

    #: The ticks to enqueue, oldest first.
    fire: list[datetime]
    #: Ticks that passed more than ``grace`` late and are not enqueued (at least this
    #: many: past :data:`MAX_TICKS` they are not counted one by one).
    skipped: int
    #: The latest tick dealt with (the new ``last_tick``); ``None``: nothing was due.
    last: datetime | None
    #: More ticks within grace than one round enqueues: the rest go next round.
    more: bool


@dataclass(frozen=True)
class Schedule:
    """One periodic schedule.

    ``grace``: how late (seconds) a tick may still be enqueued under ``missed="none"``:
    a tick delayed by a leader changing hands or a short restart still runs; a tick that
    passed while no worker ran for longer does not. ``jitter`` delays each tick's job by
    a random 0 to ``jitter`` seconds, so many schedules on the same minute spread out.
    """

    name: str
    task: str
    cron: str
    timezone: str = "UTC"
    args: dict[str, JSON] = field(default_factory=dict)
    missed: Missed = "none"
    jitter: float = 0.0
    grace: float = DEFAULT_GRACE
    queue: str | None = None

    def __post_init__(self) -> None:
        # The same safe alphabet as queues and tasks: a name is one URL path segment on
        # the dashboard and in the API, never "..", never a "/".
        names.check_config("schedule", self.name)
        if self.missed not in ("none", "latest"):
            raise ConfigError(f"schedule {self.name!r}: missed must be 'none' or 'latest'")
        if self.jitter < 0 or self.grace < 0:
            raise ConfigError(f"schedule {self.name!r}: jitter and grace must not be negative")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigError(
                f"schedule {self.name!r}: unknown timezone {self.timezone!r}"
            ) from exc
        try:
            CronSim(self.cron, datetime.now(UTC))
        except CronSimError as exc:
            raise ConfigError(f"schedule {self.name!r}: bad cron {self.cron!r}: {exc}") from exc

    def ticks(self, after: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``after``, in UTC."""
        local = after.astimezone(ZoneInfo(self.timezone))
        for tick in CronSim(self.cron, local):
            yield tick.astimezone(UTC)

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after ``after``."""
        return next(self.ticks(after))

    def due(self, after: datetime, now: datetime, limit: int = MAX_FIRE) -> Due:
        """The ticks in ``(after, now]``: every one up to ``grace`` late is enqueued (at
        most ``limit`` per round, oldest first); earlier ones are skipped, except the
        latest of them under ``missed="latest"`` when none is within grace."""
        horizon = now - timedelta(seconds=self.grace)
        ticks = self.ticks(after)
        skipped, last_skipped, first = 0, None, None
        for tick in ticks:
            if tick >= horizon:
                first = tick
                break
            skipped, last_skipped = skipped + 1, tick
            if skipped >= MAX_TICKS:
                # So many ticks passed that the rest cannot matter: jump to the horizon.
                last_skipped = self._last_before(horizon, tick)
                ticks = self.ticks(last_skipped)
                first = next(ticks, None)
                break
        fire: list[datetime] = []
        more = False
        while first is not None and first <= now:
            if len(fire) == limit:
                more = True
                break
            fire.append(first)
            first = next(ticks, None)
        if not fire and last_skipped is not None and self.missed == "latest":
            fire, skipped = [last_skipped], skipped - 1
        dealt = [t for t in (*fire, last_skipped) if t is not None]
        return Due(fire, skipped, max(dealt) if dealt else None, more)

    def _last_before(self, horizon: datetime, floor: datetime) -> datetime:
        """The latest tick before ``horizon``, no earlier than ``floor`` (a tick)."""
        latest = floor
        for tick in self.ticks(max(floor, horizon - timedelta(days=1))):
            if tick >= horizon:
                break
            latest = tick
        return latest

    def key(self, tick: datetime) -> str:
        """The idempotency key of this schedule's job for ``tick``."""
        return f"schedule:{self.name}:{tick.astimezone(UTC).isoformat()}"

    def delay(self) -> float:
        """A random jitter for one tick's job (0 without jitter)."""
        return random.uniform(0, self.jitter) if self.jitter else 0.0

    def stored(self, job: NewJob) -> str:
        """This schedule's definition as the database keeps it (canonical JSON), with
        ``job``: what the declaring worker built and checked for a tick (its task's
        queue, priority, attempts, timeout and resources, and the args as stored). The
        leader enqueues from it without needing the task's code."""
        fields = dataclasses.asdict(self)
        del fields["name"]
        fields["job"] = {f: getattr(job, f) for f in _JOB_FIELDS}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    @classmethod
    def load(cls, name: str, stored: str) -> tuple[Schedule, NewJob]:
        """The schedule and the job template of a definition written by :meth:`stored`
        (:class:`~tether.errors.ConfigError` if it is not one)."""
        try:
            fields: dict[str, Any] = json.loads(stored)
            job = fields.pop("job")
            template = NewJob(**{f: job[f] for f in _JOB_FIELDS})
            schedule = cls(name=name, **fields)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError(f"schedule {name!r}: unreadable definition: {exc}") from exc
        return schedule, dataclasses.replace(template, limits=tuple(template.limits))

    def job(self, template: NewJob, tick: datetime) -> NewJob:
        """The job for ``tick``, from the template a declaring worker built."""
        return dataclasses.replace(template, idempotency_key=self.key(tick), delay=self.delay())
