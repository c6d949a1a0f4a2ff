"""What a cancellation did, counted from the job rows it saw."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from tether.cancellation.tally import tally
from tether.job import Job
from tether.states import JobState

NOW = datetime.now(UTC)
BASE = Job(
    id=1,
    task="t",
    args={},
    queue="default",
    priority=0,
    key=None,
    state=JobState.QUEUED,
    attempt=1,
    max_attempts=3,
    timeout=None,
    run_at=NOW,
    created_at=NOW,
    started_at=None,
    finished_at=None,
    worker_id=None,
    lease_token=0,
    lease_expires_at=None,
    heartbeat_at=None,
    cancel_requested_at=None,
    cancel_reason=None,
    cancel_force=False,
    checkpoint=None,
    progress_current=None,
    progress_total=None,
    result=None,
    error=None,
    owner=None,
    idempotency_key=None,
)


def job(
    job_id: int,
    state: JobState,
    *,
    stopped_by: str | None = None,
    limits: tuple[str, ...] = (),
) -> Job:
    return dataclasses.replace(
        BASE, id=job_id, state=state, stopped_by=stopped_by, limits=limits, worker_id="w-1"
    )


def test_a_job_cancelled_before_it_ran_had_no_runner_and_releases_nothing() -> None:
    seen = tally(
        1, [job(1, JobState.CANCELLED, limits=("key:a",))], [], was_running=(), cascade=True
    )
    assert seen.cancelled == [1]
    assert (seen.runners_terminated, seen.slots_released, seen.had_runner) == ([], [], False)


def test_a_running_job_its_worker_stopped_is_a_runner_terminated_and_frees_its_slots() -> None:
    final = [job(1, JobState.CANCELLED, stopped_by="sigterm", limits=("resource:repo",))]
    seen = tally(1, final, [], was_running={1}, cascade=True)
    assert seen.runners_terminated == ["job 1 on w-1 (sigterm)"]
    assert seen.slots_released == ["resource:repo"]
    assert seen.had_runner and seen.still_running == []


def test_a_job_that_succeeded_first_is_completed_not_a_runner_stopped() -> None:
    final = [job(1, JobState.SUCCEEDED, limits=("key:a",))]
    seen = tally(1, final, [], was_running={1}, cascade=True)
    assert (seen.completed, seen.cancelled, seen.runners_terminated) == ([1], [], [])
    # It was running when asked: its slot was released as it left running.
    assert seen.had_runner and seen.slots_released == ["key:a"]


def test_a_job_still_running_is_listed_and_keeps_its_slots() -> None:
    final = [job(1, JobState.RUNNING, limits=("key:a",))]
    seen = tally(1, final, [], was_running={1}, cascade=True)
    assert seen.still_running == [1]
    assert (seen.runners_terminated, seen.slots_released) == ([], [])


def test_a_job_its_worker_killed_is_a_runner_even_if_nobody_saw_it_running() -> None:
    final = [job(1, JobState.RUNNING), job(2, JobState.CANCELLED, stopped_by="sigkill")]
    seen = tally(1, final, [], was_running={1}, cascade=True)
    assert seen.runners_terminated == ["job 2 on w-1 (sigkill)"]
    assert seen.still_running == [1]


def test_a_job_stopped_cooperatively_is_a_runner_only_if_it_was_seen_running() -> None:
    final = [
        job(1, JobState.CANCELLED, stopped_by="cooperative"),
        job(2, JobState.CANCELLED, stopped_by="cooperative"),
    ]
    seen = tally(1, final, [], was_running={2}, cascade=True)
    assert seen.runners_terminated == ["job 2 on w-1 (cooperative)"]


def test_a_handler_that_ignored_the_request_is_listed_as_abandoned() -> None:
    final = [job(1, JobState.CANCELLED, stopped_by="abandoned")]
    seen = tally(1, final, [], was_running={1}, cascade=True)
    assert seen.abandoned == [1] and seen.runners_terminated == ["job 1 on w-1 (abandoned)"]


def test_every_slot_of_a_job_that_left_running_is_released_once_a_runner_stopped() -> None:
    final = [
        job(1, JobState.CANCELLED, stopped_by="task_cancelled", limits=("key:b",)),
        job(2, JobState.CANCELLED, limits=("key:a", "key:b")),
        job(3, JobState.RUNNING, limits=("key:c",)),
    ]
    seen = tally(1, final, [], was_running={1, 3}, cascade=True)
    assert seen.slots_released == ["key:a", "key:b"]


def test_ended_jobs_are_counted_by_how_they_ended() -> None:
    final = [
        job(1, JobState.CANCELLED),
        job(2, JobState.SUCCEEDED),
        job(3, JobState.FAILED),
        job(4, JobState.CANCELLED),
    ]
    seen = tally(1, final, [], was_running=(), cascade=True)
    assert (seen.cancelled, seen.completed, seen.failed) == ([1, 4], [2], [3])


def test_without_cascade_the_blocked_dependents_are_listed() -> None:
    downstream = [job(2, JobState.BLOCKED), job(3, JobState.QUEUED), job(4, JobState.BLOCKED)]
    alone = tally(1, [job(1, JobState.CANCELLED)], downstream, was_running=(), cascade=False)
    assert alone.dependents_blocked == [2, 4]
    cascaded = tally(1, [job(1, JobState.CANCELLED)], downstream, was_running=(), cascade=True)
    assert cascaded.dependents_blocked == []
