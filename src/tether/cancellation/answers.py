"""The answer a cancellation gives whoever asked for it (a
:class:`~tether.cancellation.records.CancellationResult`)."""

from __future__ import annotations

import time

from tether.cancellation.records import (
    CancellationRecord,
    CancellationResult,
    CancellationSummary,
    Outcome,
    Status,
)
from tether.job import Job
from tether.states import JobState


def at_once(job: Job, outcome: Outcome, started: float) -> CancellationResult:
    """The answer when there was nothing to do (no record)."""
    return CancellationResult(
        cancellation_id="",
        job_id=job.id,
        status=Status.COMPLETED,
        outcome=outcome,
        job=job,
        success=True,
        tasks_cancelled=[],
        tasks_completed=[],
        tasks_failed=[],
        runners_terminated=[],
        slots_released=[],
        artifacts_preserved=[],
        dependents_blocked=[],
        errors=[],
        duration_seconds=round(time.monotonic() - started, 6),
    )


def outcome(job: Job) -> Outcome:
    """What became of the job itself, from its state."""
    if job.state is JobState.CANCELLED:
        return "cancelled"
    if job.state is JobState.SUCCEEDED:
        return "finished_first"
    if job.state is JobState.FAILED and job.budget is not None and job.usage > job.budget:
        return "failed_over_budget"
    if job.state is JobState.FAILED:
        return "finished_first"
    return "requested"


def from_record(record: CancellationRecord, job: Job, started: float) -> CancellationResult:
    """The answer a record gives, with its job as it is now."""
    said = record.result or CancellationSummary()
    duration = said.duration_seconds
    return CancellationResult(
        cancellation_id=record.id,
        job_id=record.job_id,
        status=record.status,
        outcome=outcome(job),
        job=job,
        success=record.status is Status.COMPLETED,
        tasks_cancelled=list(said.tasks_cancelled or []),
        tasks_completed=list(said.tasks_completed or []),
        tasks_failed=list(said.tasks_failed or []),
        runners_terminated=list(said.runners_terminated or []),
        slots_released=list(said.slots_released or []),
        artifacts_preserved=list(said.artifacts_preserved or []),
        dependents_blocked=list(said.dependents_blocked or []),
        errors=record.errors,
        duration_seconds=float(duration if duration is not None else time.monotonic() - started),
        steps=record.steps,
    )
