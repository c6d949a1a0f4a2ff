"""How a cancellation tells what it did: the one place that turns a
:class:`~tether.cancellation.tally.Tally` into its steps, errors and summary."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tether.cancellation.records import (
    CancellationStep,
    CancellationSummary,
    Status,
    timestamp,
)
from tether.cancellation.tally import Tally
from tether.job import Job

#: How an open record is settled when its canceller is gone (the step it gains).
SETTLE_STEP = "settle_from_job_states"
#: Why a record whose canceller died is settled by somebody else.
CANCELLER_GONE = "nobody settled it: its canceller is gone"
#: When a settled record's jobs were seen still running.
WHEN_SETTLED = "when its cancellation was settled"


def after(wait: float) -> str:
    """When a canceller that waited ``wait`` seconds saw its jobs still running."""
    return f"after {wait:g}s"


def still_running(job_id: int, when: str) -> str:
    """The error of a job still running ``when`` the cancellation looked."""
    return (
        f"job {job_id} still running {when}; it cannot run again and ends cancelled when "
        "its worker stops or its lease expires"
    )


def is_still_running(error: str, job_id: int) -> bool:
    """Whether ``error`` says that ``job_id`` was still running (a follow-up clears it
    once the job has stopped)."""
    return error.startswith(f"job {job_id} still running")


def errors(tally: Tally, when: str) -> list[str]:
    """What the tally leaves undone: jobs still running ``when`` it was taken, and
    handlers that ignored the request."""
    return [still_running(i, when) for i in tally.still_running] + [
        f"job {i}'s handler ignored cancellation and was abandoned: its lease was revoked, "
        "so nothing it writes counts, but it may still run"
        for i in tally.abandoned
    ]


def ending(problems: Sequence[str]) -> Status:
    """How a cancellation that counted everything ends, given its errors."""
    return Status.PARTIAL if problems else Status.COMPLETED


def stop_runners(tally: Tally, problems: list[str], started_at: str) -> CancellationStep:
    """Step 2: the runners stopped, or still running once the wait ended."""
    return CancellationStep(
        "stop_runners",
        "failed" if tally.still_running else ("completed" if tally.had_runner else "skipped"),
        started_at,
        timestamp(),
        {
            "runners_terminated": tally.runners_terminated,
            "still_running": tally.still_running,
            "abandoned": tally.abandoned,
        },
        "; ".join(problems) if tally.still_running else None,
    )


def update_tasks(tally: Tally, started_at: str) -> CancellationStep:
    """Step 3: what became of the tasks (completed work is preserved, never undone)."""
    return CancellationStep(
        "update_tasks",
        "completed",
        started_at,
        timestamp(),
        {
            "cancelled": tally.cancelled,
            "completed": tally.completed,
            "failed": tally.failed,
            "dependents_blocked": tally.dependents_blocked,
        },
    )


def clean_resources(tally: Tally, artifacts: list[str], started_at: str) -> CancellationStep:
    """Step 4: the slots the database released and the artifacts kept."""
    return CancellationStep(
        "clean_resources",
        "completed",
        started_at,
        timestamp(),
        {"slots_released": tally.slots_released, "artifacts_preserved": artifacts},
    )


def request(
    before: Job, job: Job, downstream: Sequence[Job], cascade: bool, wait: float, started_at: str
) -> CancellationStep:
    """Step 1: new assignment stopped (what was not running is cancelled, what runs is
    asked to stop, with ``cascade`` everything downstream too)."""
    return CancellationStep(
        "request",
        "completed",
        started_at,
        timestamp(),
        {
            "state_before": before.state.value,
            "state_after": job.display_state,
            "cascade": cascade,
            "downstream": [d.id for d in downstream],
            # How long this request waits for the runners: a record older than that (and
            # the adoption bound) has lost its canceller.
            "wait": wait,
        },
    )


def settled(
    tally: Tally | None, final: Sequence[Job], previous: Status, why: str, started_at: str
) -> CancellationStep:
    """The step of a record settled from the job states by somebody else (``tally`` is
    ``None`` if its job no longer exists)."""
    details: dict[str, Any] = {"previous_status": previous.value, "why": why}
    if tally is not None:
        details |= {
            "ended": {str(j.id): j.state.value for j in final if j.id not in tally.still_running},
            "still_running": tally.still_running,
            "runners_terminated": tally.runners_terminated,
        }
    return CancellationStep(SETTLE_STEP, "completed", started_at, timestamp(), details)


def followed_up(tally: Tally, jobs: Sequence[Job]) -> CancellationStep:
    """The step of a partial record completed once the jobs it waited for stopped."""
    now = timestamp()
    return CancellationStep(
        "follow_up",
        "completed",
        now,
        timestamp(),
        {
            "ended": {str(j.id): j.state.value for j in jobs},
            "runners_terminated": tally.runners_terminated,
        },
    )


def summary(tally: Tally, artifacts: list[str], problems: list[str]) -> CancellationSummary:
    """What the record keeps of a cancellation that counted everything (its duration is
    added as it settles)."""
    return CancellationSummary(
        tasks_cancelled=tally.cancelled,
        tasks_completed=tally.completed,
        tasks_failed=tally.failed,
        runners_terminated=tally.runners_terminated,
        slots_released=tally.slots_released,
        artifacts_preserved=artifacts,
        dependents_blocked=tally.dependents_blocked,
        errors=problems,
    )


def followed_up_summary(
    previous: CancellationSummary, tally: Tally, problems: list[str]
) -> CancellationSummary:
    """A partial record's summary once the jobs it waited for stopped: ``tally``'s jobs
    and runners added, ``problems`` its remaining errors."""
    return dataclasses.replace(
        previous,
        tasks_cancelled=sorted({*(previous.tasks_cancelled or []), *tally.cancelled}),
        tasks_completed=sorted({*(previous.tasks_completed or []), *tally.completed}),
        tasks_failed=sorted({*(previous.tasks_failed or []), *tally.failed}),
        runners_terminated=sorted(
            {*(previous.runners_terminated or []), *tally.runners_terminated}
        ),
        errors=problems,
    )
