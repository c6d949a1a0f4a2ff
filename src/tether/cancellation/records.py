"""A cancellation's records: its status, its steps, what it did, and the answer to the
person who asked."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from tether.job import CancellationRow, Job


class Status(StrEnum):
    """Where a cancellation stands: four steps under way, then one of three ends. The
    values are what the database keeps and the API and CLI show."""

    INITIATED = "initiated"
    STOPPING_RUNNERS = "stopping_runners"
    UPDATING_TASKS = "updating_tasks"
    CLEANING_RESOURCES = "cleaning_resources"
    COMPLETED = "completed"
    PARTIAL = "partial"
    FAILED = "failed"

    @property
    def settled(self) -> bool:
        """Whether a cancellation with this status has finished."""
        return self in (Status.COMPLETED, Status.PARTIAL, Status.FAILED)


#: How one step of a cancellation went.
StepStatus = Literal["completed", "failed", "skipped"]


Outcome = Literal[
    "cancelled", "already_cancelled", "finished_first", "failed_over_budget", "requested"
]


def timestamp() -> str:
    """Now, as a step records its times."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class CancellationStep:
    """One step of a cancellation, with its times, details and error."""

    name: str
    status: StepStatus
    started_at: str
    completed_at: str
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The step as its record keeps it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CancellationStep:
        """A step as its record keeps it."""
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class CancellationSummary:
    """What a settled cancellation did, as its record keeps it.

    A field is ``None`` where the record does not say: a cancellation that failed before
    it counted anything keeps only its errors and duration.
    """

    tasks_cancelled: list[int] | None = None
    tasks_completed: list[int] | None = None
    tasks_failed: list[int] | None = None
    runners_terminated: list[str] | None = None
    slots_released: list[str] | None = None
    artifacts_preserved: list[str] | None = None
    dependents_blocked: list[int] | None = None
    errors: list[str] | None = None
    duration_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The summary as the record keeps it: only what it says, in this order."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CancellationSummary:
        """A summary as the record keeps it."""
        return cls(**data)


@dataclass(frozen=True)
class CancellationResult:
    """What a cancellation did.

    ``outcome`` sums it up for the job itself: ``cancelled``, ``already_cancelled``,
    ``finished_first`` (it was running and finished before it saw the request; its
    result stands), ``failed_over_budget`` (a job over its budget fails instead), or
    ``requested`` (still running when the wait ended; it will not run again).
    """

    cancellation_id: str
    job_id: int
    status: Status
    outcome: Outcome
    job: Job
    success: bool
    tasks_cancelled: list[int]
    tasks_completed: list[int]
    tasks_failed: list[int]
    runners_terminated: list[str]
    slots_released: list[str]
    artifacts_preserved: list[str]
    dependents_blocked: list[int]
    errors: list[str]
    duration_seconds: float
    steps: list[CancellationStep] = field(default_factory=list)

    @property
    def cancelled(self) -> bool:
        """Whether the job ended (or will end) cancelled rather than finished."""
        return self.outcome in ("cancelled", "already_cancelled", "requested")


@dataclass(frozen=True)
class CancellationRecord:
    """A persisted cancellation as people read it."""

    id: str
    job_id: int
    request_id: str | None
    reason: str | None
    force: bool
    cascade: bool
    initiated_by: str | None
    initiated_at: datetime
    status: Status
    steps: list[CancellationStep]
    result: CancellationSummary | None
    error: str | None
    completed_at: datetime | None

    @property
    def settled(self) -> bool:
        """Whether the cancellation has finished (completed, partial or failed)."""
        return self.status.settled

    @property
    def errors(self) -> list[str]:
        """What went wrong: its result's errors, else its error, if any."""
        listed = self.result.errors if self.result is not None else None
        return list(listed or []) or ([self.error] if self.error else [])


def record_from_row(row: CancellationRow) -> CancellationRecord:
    """Typed view of a stored record."""
    return CancellationRecord(
        **{
            **dataclasses.asdict(row),
            "status": Status(row.status),
            "steps": [CancellationStep.from_json(s) for s in row.steps],
            "result": CancellationSummary.from_json(row.result) if row.result is not None else None,
        }
    )
