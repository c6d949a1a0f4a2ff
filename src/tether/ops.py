"""Row types of the maintenance features: the leader, the pruner and schedules."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

MAINTENANCE = "maintenance"
"""The name of the maintenance leadership (the lease row the leader holds)."""

PRUNE_KINDS = (
    "jobs",
    "events",
    "dependencies",
    "artifacts",
    "steps",
    "signals",
    "logs",
    "cancellations",
    "audit",
    "workers",
)
"""What the pruner counts, one label of ``tether_pruned_total`` each."""


@dataclass(frozen=True)
class LeaderInfo:
    """Who holds a leadership lease, since when, and until when (database time)."""

    name: str
    holder: str
    since: datetime
    expires_at: datetime
    # False once the lease ran out without renewal: nobody leads until someone takes it.
    active: bool = True


@dataclass(frozen=True)
class PruneBatch:
    """One bounded batch of job pruning."""

    counts: dict[str, int]
    # How many candidate jobs the batch looked at (fewer than the limit: the last batch).
    scanned: int
    # How many candidates it kept because their workflow is still active.
    kept: int = 0
    # Where the next batch starts: (finished_at, id) of the last candidate looked at.
    cursor: tuple[datetime, int] | None = None


@dataclass
class PruneReport:
    """What a pruning round deleted (or, in a dry run, would delete), by kind."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRUNE_KINDS, 0))
    # Jobs old enough that were kept because their workflow is still active.
    kept: int = 0
    dry_run: bool = False

    def add(self, counts: dict[str, int]) -> None:
        """Add one batch's counts."""
        for kind, n in counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n

    @property
    def total(self) -> int:
        """Rows of every kind."""
        return sum(self.counts.values())


@dataclass(frozen=True)
class ScheduleRow:
    """A periodic schedule's state in the database (times are database time)."""

    name: str
    task: str
    cron: str
    timezone: str
    paused: bool
    # The latest tick the scheduler dealt with (enqueued, skipped or paused through).
    last_tick: datetime | None
    next_tick: datetime | None
    # When the last job was enqueued, and which.
    last_run_at: datetime | None
    last_job_id: int | None
    # The definition the leader fires (see Schedule.stored; None: written by an older
    # version), and when and by which worker it was last set (the newest wins).
    definition: str | None = None
    defined_at: datetime | None = None
    defined_by: str | None = None
    # How many live workers declare it (None: not counted). A schedule no live worker
    # declares still fires while its row is there; `tether schedule remove` deletes it.
    declared_by: int | None = None


@dataclass(frozen=True)
class ScheduleDeclaration:
    """One schedule as a starting worker records it."""

    name: str
    task: str
    cron: str
    timezone: str
    # What the leader fires it from (see Schedule.stored).
    definition: str


@dataclass(frozen=True)
class ScheduleRegistration:
    """What recording a worker's schedules did."""

    # The rows whose different definition was replaced, as they were before.
    replaced: list[ScheduleRow] = field(default_factory=list)
    # Names whose rows someone else held locked: recorded at a later try.
    pending: list[str] = field(default_factory=list)
