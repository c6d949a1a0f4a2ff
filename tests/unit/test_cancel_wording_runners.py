"""How the CLI words a cancellation's steps (pure: no store involved)."""

from __future__ import annotations

from tether.cancellation import CancellationResult
from tether.cancellation.records import CancellationStep, Status
from tether.cli.cancel import _progress_lines
from tether.job import Job


def _result(job: Job, runners: list[str], abandoned: list[int]) -> CancellationResult:
    step = CancellationStep(
        "stop_runners",
        "completed",
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:01Z",
        {"runners_terminated": runners, "still_running": [], "abandoned": abandoned},
    )
    return CancellationResult(
        cancellation_id="cancel-x", job_id=job.id, status=Status.PARTIAL, outcome="cancelled",
        job=job, success=True, tasks_cancelled=[job.id], tasks_completed=[], tasks_failed=[],
        runners_terminated=runners, slots_released=[], artifacts_preserved=[],
        dependents_blocked=[], errors=[], duration_seconds=1.0, steps=[step],
    )  # fmt: skip


def _job() -> Job:
    return Job.__new__(Job)  # only its id is read, and only by _result's caller


def test_an_abandoned_handler_is_not_called_terminated() -> None:
    job = _job()
    object.__setattr__(job, "id", 7)
    lines = [t.plain for t in _progress_lines(_result(job, ["job 7 on w-1 (abandoned)"], [7]))]
    assert not any("Terminated" in line for line in lines), lines
    assert any(line.startswith("✗ Abandoned 1 handler(s)") for line in lines), lines


def test_a_stopped_runner_is_still_terminated() -> None:
    job = _job()
    object.__setattr__(job, "id", 7)
    lines = [t.plain for t in _progress_lines(_result(job, ["job 7 on w-1 (sigterm)"], []))]
    assert lines == ["✓ Terminated 1 runner(s): job 7 on w-1 (sigterm)"]
