"""What an attempt's end means for its job: the retry, fail and release policy.

Pure logic: the worker gathers what it knows of an attempt when its handler ends (an
:class:`Attempt`), and :func:`decide` turns that into the :class:`~tether.job.Outcome` to
record, or into nothing when the lease is lost. Nothing here touches the store or the
event loop.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Literal

from tether import payload
from tether.config import RetryPolicy
from tether.durable import Parked
from tether.errors import Cancelled, Fail, InvalidJobError, Retry, WaitForChildren
from tether.job import Job, Outcome
from tether.states import JobState

ERROR_LIMIT = 4000  # characters of traceback kept on the job

#: How a handler ended: it returned ``value``, raised ``value``, was cancelled, or never
#: started (no thread was free for it in time).
Ending = Literal["result", "error", "cancelled", "unstarted"]


@dataclass(frozen=True)
class Attempt:
    """What the worker knows of one attempt once its handler has ended."""

    job: Job
    #: The task's backoff between attempts.
    retry: RetryPolicy
    ending: Ending
    #: The handler's return value or exception (``None`` when cancelled or unstarted).
    value: Any = None
    #: Why the worker asked it to stop: ``cancel``, ``pause``, ``shutdown`` or
    #: ``lease_lost`` (``None``: nobody asked).
    interrupt: str | None = None
    #: The pause's reason (e.g. an exceeded budget).
    detail: str | None = None
    #: The worker stopped the handler (timeout, cancel, pause, shutdown).
    stopped_by_us: bool = False
    #: How the handler was stopped (``cooperative`` when it ended by itself).
    stopped_by: str | None = None
    timed_out: bool = False
    #: The handler had been told that the worker is stopping (``ctx.stopping``).
    stopping: bool = False


def decide(
    attempt: Attempt, *, max_payload_bytes: int, handler_start_timeout: float
) -> Outcome | None:
    """The outcome to record for ``attempt``; ``None`` when its lease is lost, for the
    new holder of the job decides then, or when a sleep or a wait parked the job."""
    job = attempt.job
    if attempt.interrupt == "lease_lost":
        return None
    if isinstance(attempt.value, Parked):
        return None  # a sleep or a wait already released the job, with its lease
    if attempt.ending == "unstarted":
        return unstarted(
            job,
            f"handed back unstarted: no thread free to start it within {handler_start_timeout:g}s",
        )
    value = attempt.value
    phase_end = value if isinstance(value, WaitForChildren) else None
    # A phase that ended on its own is recorded even under a pending pause or cancel:
    # the store lets a cancel win, and a pause applies when the next phase starts.
    if phase_end is not None and not attempt.stopped_by_us:
        return Outcome(
            job.id,
            job.lease_token,
            JobState.BLOCKED,
            phase=phase_end.phase,
            reason=f"waiting for children; next phase {phase_end.phase}",
        )
    if attempt.ending == "result" and not attempt.stopped_by_us:
        try:
            encoded = payload.encode(value)
        except ValueError as exc:
            return failure(job, attempt.retry, Fail(f"result cannot be stored: {exc}"))
        if len(encoded.encode()) > max_payload_bytes:
            return failure(job, attempt.retry, Fail("result exceeds the payload size limit"))
        return Outcome(job.id, job.lease_token, JobState.SUCCEEDED, result_json=encoded)
    stopped_by = attempt.stopped_by or "cooperative"
    if attempt.interrupt == "cancel":
        return Outcome(
            job.id,
            job.lease_token,
            JobState.CANCELLED,
            error=f"cancelled while running (stopped: {stopped_by})",
            stopped_by=stopped_by,
        )
    if attempt.interrupt == "pause":
        return Outcome(
            job.id,
            job.lease_token,
            JobState.PAUSED,
            reason=attempt.detail or "pause requested",
            stopped_by=stopped_by,
        )
    if attempt.interrupt == "shutdown" or _stepped_aside(attempt):
        return Outcome(
            job.id,
            job.lease_token,
            JobState.QUEUED,
            reason="released at worker shutdown",
            stopped_by=stopped_by,
        )
    if attempt.timed_out:
        return failure(job, attempt.retry, TimeoutError(f"timed out after {job.timeout}s"))
    if attempt.ending == "error":
        return failure(job, attempt.retry, value)
    return failure(job, attempt.retry, RuntimeError("handler was cancelled"))


def _stepped_aside(attempt: Attempt) -> bool:
    """Whether the handler ended itself because the worker is stopping: it raised
    ``Cancelled`` (or was cancelled) after ``ctx.stopping``, unasked otherwise."""
    return (
        attempt.interrupt is None
        and attempt.stopping
        and (attempt.ending == "cancelled" or isinstance(attempt.value, Cancelled))
    )


def failure(job: Job, retry: RetryPolicy, exc: BaseException) -> Outcome:
    """A failed attempt: ``failed`` for :class:`Fail` or once the attempts are spent,
    otherwise ``retrying`` after the :class:`Retry`'s delay or the policy's backoff."""
    error = _describe(exc)
    if isinstance(exc, Fail):
        return Outcome(job.id, job.lease_token, JobState.FAILED, error=error, reason="failed")
    retries = job.max_attempts - 1
    if job.attempt >= job.max_attempts:
        reason = f"max retries exceeded ({retries}): {_last_line(error)}"
        return Outcome(job.id, job.lease_token, JobState.FAILED, error=error, reason=reason)
    delay = exc.delay if isinstance(exc, Retry) and exc.delay is not None else None
    if delay is None:
        delay = retry.delay(job.attempt)
    reason = f"retry {job.attempt}/{retries} in {delay:.1f}s: {_last_line(error)}"
    return Outcome(
        job.id, job.lease_token, JobState.RETRYING, error=error, delay=delay, reason=reason
    )


def unfit_arguments(exc: InvalidJobError) -> Fail:
    """Arguments the handler cannot take: no attempt could ever bind them, so the job
    fails at once rather than retrying."""
    return Fail(f"the arguments do not fit the handler: {exc}")


def unstarted(job: Job, reason: str) -> Outcome:
    """Back to ``queued``, its handler never started: the attempt is not spent."""
    return Outcome(job.id, job.lease_token, JobState.QUEUED, reason=reason)


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, Retry | Fail | TimeoutError):
        return payload.printable(f"{type(exc).__name__}: {exc}")
    text = "".join(traceback.format_exception(exc))
    return payload.printable(text[-ERROR_LIMIT:])
