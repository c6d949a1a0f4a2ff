"""The retry, fail and release policy: what each way an attempt can end records."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tether.config import RetryPolicy
from tether.errors import Cancelled, Fail, InvalidJobError, Retry, WaitForChildren
from tether.job import Job, Outcome
from tether.states import JobState
from tether.worker.outcome import ERROR_LIMIT, Attempt, decide, failure, unfit_arguments

NO_JITTER = RetryPolicy(base_delay=2.0, factor=3.0, max_delay=100.0, jitter=0.0)


def job(attempt: int = 1, max_attempts: int = 3, timeout: float | None = None) -> Job:
    now = datetime.now(UTC)
    return Job(
        id=7,
        task="t",
        args={},
        queue="default",
        priority=0,
        key=None,
        state=JobState.RUNNING,
        attempt=attempt,
        max_attempts=max_attempts,
        timeout=timeout,
        run_at=now,
        created_at=now,
        started_at=now,
        finished_at=None,
        worker_id="w",
        lease_token=42,
        lease_expires_at=now,
        heartbeat_at=now,
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


def outcome(
    *, of: Job | None = None, max_payload_bytes: int = 1000, **facts: Any
) -> Outcome | None:
    facts.setdefault("ending", "result")
    attempt = Attempt(of or job(), NO_JITTER, **facts)
    return decide(attempt, max_payload_bytes=max_payload_bytes, handler_start_timeout=2.5)


def decided(**facts: Any) -> Outcome:
    result = outcome(**facts)
    assert result is not None
    return result


def test_a_returned_value_succeeds_with_its_result_under_the_lease_token() -> None:
    got = decided(ending="result", value={"n": 1})
    assert (got.job_id, got.lease_token, got.state) == (7, 42, JobState.SUCCEEDED)
    assert got.result_json == '{"n":1}'


def test_a_result_that_cannot_be_stored_fails_at_once() -> None:
    got = decided(ending="result", value=object())
    assert got.state is JobState.FAILED and got.reason == "failed"
    assert got.error is not None and got.error.startswith("Fail: result cannot be stored")


def test_a_result_over_the_payload_limit_fails_at_once() -> None:
    got = decided(ending="result", value="x" * 100, max_payload_bytes=50)
    assert got.state is JobState.FAILED
    assert got.error == "Fail: result exceeds the payload size limit"


def test_a_lost_lease_records_nothing_whatever_the_handler_did() -> None:
    for ending in ("result", "error", "cancelled", "unstarted"):
        assert outcome(ending=ending, value=None, interrupt="lease_lost") is None


def test_an_unstarted_handler_goes_back_to_queued_without_spending_the_attempt() -> None:
    got = decided(ending="unstarted")
    assert got.state is JobState.QUEUED
    assert got.reason == "handed back unstarted: no thread free to start it within 2.5s"


def test_waiting_for_children_blocks_the_job_until_its_next_phase() -> None:
    for ending in ("result", "error"):
        got = decided(ending=ending, value=WaitForChildren("sum"))
        assert (got.state, got.phase) == (JobState.BLOCKED, "sum")
        assert got.reason == "waiting for children; next phase sum"


def test_a_phase_ended_on_its_own_is_recorded_despite_a_pending_cancel() -> None:
    got = decided(ending="result", value=WaitForChildren("sum"), interrupt="cancel")
    assert got.state is JobState.BLOCKED


def test_a_phase_end_after_the_worker_stopped_the_handler_is_not_a_phase_end() -> None:
    got = decided(
        ending="error", value=WaitForChildren("sum"), interrupt="cancel", stopped_by_us=True
    )
    assert got.state is JobState.CANCELLED


def test_a_cancelled_job_records_how_its_handler_was_stopped() -> None:
    got = decided(ending="cancelled", interrupt="cancel", stopped_by_us=True, stopped_by="kill")
    assert got.state is JobState.CANCELLED
    assert (got.stopped_by, got.error) == ("kill", "cancelled while running (stopped: kill)")


def test_a_handler_that_stopped_by_itself_was_stopped_cooperatively() -> None:
    got = decided(ending="error", value=Cancelled("cancel"), interrupt="cancel")
    assert got.stopped_by == "cooperative"


def test_a_value_returned_before_a_cancel_took_effect_still_succeeds() -> None:
    assert decided(ending="result", value=1, interrupt="cancel").state is JobState.SUCCEEDED


def test_a_value_returned_after_the_worker_stopped_the_handler_does_not_succeed() -> None:
    got = decided(ending="result", value=1, interrupt="cancel", stopped_by_us=True)
    assert got.state is JobState.CANCELLED


def test_a_pause_records_its_reason_or_the_default_one() -> None:
    budget = decided(ending="cancelled", interrupt="pause", detail="budget exceeded: 5 of 4")
    asked = decided(ending="cancelled", interrupt="pause")
    assert budget.state is asked.state is JobState.PAUSED
    assert (budget.reason, asked.reason) == ("budget exceeded: 5 of 4", "pause requested")


def test_a_job_stopped_at_shutdown_is_released_to_queued() -> None:
    got = decided(ending="cancelled", interrupt="shutdown", stopped_by_us=True, stopped_by="grace")
    assert (got.state, got.reason) == (JobState.QUEUED, "released at worker shutdown")
    assert got.stopped_by == "grace"


def test_a_handler_that_steps_aside_once_told_of_the_stop_is_released() -> None:
    raised = decided(ending="error", value=Cancelled("shutdown"), stopping=True)
    cancelled = decided(ending="cancelled", stopping=True)
    assert raised.state is cancelled.state is JobState.QUEUED


def test_a_handler_that_raises_cancelled_unasked_and_no_stop_is_a_failed_attempt() -> None:
    got = decided(ending="error", value=Cancelled("cancel"))
    assert got.state is JobState.RETRYING


def test_an_error_after_the_stop_was_announced_is_still_an_error() -> None:
    got = decided(ending="error", value=ValueError("boom"), stopping=True)
    assert got.state is JobState.RETRYING


def test_a_timed_out_attempt_is_retried_with_the_timeout_as_its_error() -> None:
    got = decided(of=job(timeout=1.5), ending="cancelled", timed_out=True, stopped_by_us=True)
    assert got.state is JobState.RETRYING
    assert got.error == "TimeoutError: timed out after 1.5s"


def test_a_cancelled_handler_nobody_stopped_is_a_failed_attempt() -> None:
    got = decided(ending="cancelled")
    assert got.state is JobState.RETRYING
    assert got.error is not None and "RuntimeError: handler was cancelled" in got.error


def test_an_error_is_retried_after_the_policy_backoff_with_its_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError as exc:
        got = decided(of=job(attempt=2, max_attempts=4), ending="error", value=exc)
    assert (got.state, got.delay) == (JobState.RETRYING, 6.0)  # 2 * 3 ** (2 - 1)
    assert got.error is not None and got.error.startswith("Traceback")
    assert got.reason == "retry 2/3 in 6.0s: ValueError: boom"


def test_the_policy_backoff_grows_per_attempt_up_to_its_cap() -> None:
    delays = [
        failure(job(attempt=n, max_attempts=10), NO_JITTER, ValueError()).delay for n in range(1, 7)
    ]
    assert delays == [2.0, 6.0, 18.0, 54.0, 100.0, 100.0]


def test_retry_with_a_delay_overrides_the_policy_backoff() -> None:
    got = decided(ending="error", value=Retry("later", delay=30.0))
    assert (got.state, got.delay) == (JobState.RETRYING, 30.0)
    assert got.error == "Retry: later"


def test_retry_without_a_delay_uses_the_policy_backoff() -> None:
    assert decided(ending="error", value=Retry("later")).delay == 2.0


def test_retry_on_the_last_attempt_fails_the_job() -> None:
    got = decided(of=job(attempt=3, max_attempts=3), ending="error", value=Retry("later"))
    assert got.state is JobState.FAILED
    assert got.reason == "max retries exceeded (2): Retry: later"


def test_fail_fails_at_once_with_attempts_left() -> None:
    got = decided(of=job(attempt=1, max_attempts=5), ending="error", value=Fail("no"))
    assert (got.state, got.reason, got.error) == (JobState.FAILED, "failed", "Fail: no")


def test_arguments_that_do_not_fit_fail_at_once_with_attempts_left() -> None:
    try:
        raise InvalidJobError("arguments of 't': missing a required argument: 'n'")
    except InvalidJobError as exc:
        unfit = unfit_arguments(exc)
    got = decided(of=job(attempt=1, max_attempts=5), ending="error", value=unfit)
    assert (got.state, got.reason) == (JobState.FAILED, "failed")
    assert got.error == (
        "Fail: the arguments do not fit the handler: "
        "arguments of 't': missing a required argument: 'n'"
    )


def test_an_error_on_the_last_attempt_fails_with_its_last_line_as_reason() -> None:
    got = decided(of=job(attempt=3, max_attempts=3), ending="error", value=KeyError("k"))
    assert got.state is JobState.FAILED
    assert got.reason == "max retries exceeded (2): KeyError: 'k'"


def test_a_long_traceback_keeps_its_end() -> None:
    got = decided(ending="error", value=ValueError("x" * (2 * ERROR_LIMIT) + " end"))
    assert got.error is not None and len(got.error) == ERROR_LIMIT
    assert got.error.rstrip().endswith(" end")
