"""Periodic schedules: a task enqueued once per tick of a cron expression.

A schedule is declared in code (``@app.periodic(cron=...)`` or ``app.schedule(...)``)
and fired by the maintenance leader's :class:`~tether.maintenance.scheduler.Scheduler`.
Each tick's job carries the idempotency key ``schedule:<name>:<tick>``, so however many
schedulers look at a tick (two leaders overlapping, a restart in the middle of a round),
it is enqueued once.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from tether import names
from tether.errors import ConfigError
from tether.job import JSON

Missed = Literal["none", "latest"]
"""What to do with ticks that passed while no scheduler ran: skip them (``none``), or
enqueue the latest one (``latest``). Earlier missed ticks are never enqueued."""

DEFAULT_GRACE = 60.0
# The most ticks looked at per round: a per-second schedule after a long outage must not
# make one round walk millions of ticks.
MAX_TICKS = 10_000


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

    def due(self, after: datetime, now: datetime) -> tuple[datetime | None, int]:
        """``(latest tick in (after, now], number of ticks in that span)``."""
        latest, count = None, 0
        for tick in self.ticks(after):
            if tick > now:
                break
            latest, count = tick, count + 1
            if count >= MAX_TICKS:
                # So many ticks passed that the rest cannot matter: jump to the last.
                return self._last_before(now, tick), count
        return latest, count

    def _last_before(self, now: datetime, floor: datetime) -> datetime:
        step = timedelta(days=1)
        start = max(floor, now - step)
        latest = floor
        for tick in self.ticks(start):
            if tick > now:
                break
            latest = tick
        return latest

    def fires(self, tick: datetime, now: datetime) -> bool:
        """Whether the due ``tick`` is enqueued at ``now`` under the missed-tick policy."""
        return self.missed == "latest" or (now - tick).total_seconds() <= self.grace

    def key(self, tick: datetime) -> str:
        """The idempotency key of this schedule's job for ``tick``."""
        return f"schedule:{self.name}:{tick.astimezone(UTC).isoformat()}"

    def delay(self) -> float:
        """A random jitter for one tick's job (0 without jitter)."""
        return random.uniform(0, self.jitter) if self.jitter else 0.0
