"""The cancellation service: one persisted record per cancelled job, step by step.

A cancellation moves through ``initiated → stopping_runners → updating_tasks →
cleaning_resources`` and ends ``completed``, ``partial`` or ``failed``. Repeated or
concurrent requests for the same job share one record. Every wait is bounded, and the
record always ends in a settled, truthful status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar

from tether import hints as h
from tether import metrics
from tether.config import StoreRetry
from tether.errors import (
    IllegalTransitionError,
    InvalidJobError,
    JobNotFoundError,
    RowLocked,
    StoreError,
)
from tether.job import CancellationRow, Job, JobFilter
from tether.states import JobState
from tether.store.protocols import CancellationStore, JobStore

FINAL = frozenset({"completed", "partial", "failed"})
READ_CHUNK = 1000
LIVE = frozenset(
    {JobState.QUEUED, JobState.BLOCKED, JobState.RUNNING, JobState.RETRYING, JobState.PAUSED}
)
Outcome = Literal[
    "cancelled", "already_cancelled", "finished_first", "failed_over_budget", "requested"
]
STOPPED = {"task_cancelled", "sigterm", "sigkill"}
#: A record nobody settled this long after it began (plus the wait its canceller asked
#: for) has lost its canceller: the follow-up settles it from the job states.
ADOPT_AFTER = 30.0
SETTLE_STEP = "settle_from_job_states"
#: Retries of each store call before a record ends ``failed`` (AppConfig.cancellation_retry).
DEFAULT_RETRY = StoreRetry()
log = logging.getLogger("tether.cancellation")
T = TypeVar("T")


class _Superseded(Exception):
    """Somebody else settled the record meanwhile (a follow-up that adopted it)."""


@dataclass(frozen=True)
class CancellationStep:
    """One step of a cancellation, with its times, details and error."""

    name: str
    status: Literal["completed", "failed", "skipped"]
    started_at: str
    completed_at: str
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


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
    status: str
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
    status: str
    steps: list[CancellationStep]
    result: dict[str, Any] | None
    error: str | None
    completed_at: datetime | None

    @property
    def settled(self) -> bool:
        """Whether the cancellation has finished (completed, partial or failed)."""
        return self.status in FINAL


def record_from_row(row: CancellationRow) -> CancellationRecord:
    """Typed view of a stored record."""
    steps = [CancellationStep(**s) for s in row.steps]
    return CancellationRecord(**{**dataclasses.asdict(row), "steps": steps})


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class CancellationBackend(JobStore, CancellationStore, Protocol):
    """What a cancellation touches: the jobs it reads and cancels, and its record."""


class CancellationService:
    """Runs cancellations for an :class:`~tether.App` (see the module docstring)."""

    def __init__(
        self,
        store: CancellationBackend,
        poll_interval: float,
        *,
        adopt_after: float = ADOPT_AFTER,
        retry: StoreRetry = DEFAULT_RETRY,
    ) -> None:
        self.store = store
        self._poll = poll_interval
        self._adopt_after = adopt_after
        self._retry_policy = retry

    async def _retry(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, tried again with backoff while the store fails transiently; the
        last try's ``StoreError`` is raised."""
        for attempt in range(1, self._retry_policy.attempts):
            try:
                return await call()
            except StoreError as exc:
                delay = self._retry_policy.backoff.delay(attempt)
                log.warning("cancellation: store call failed (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
        return await call()

    async def cancel(
        self,
        job_id: int,
        *,
        reason: str,
        force: bool,
        cascade: bool,
        wait: float,
        actor: str | None,
        request_id: str | None,
    ) -> CancellationResult:
        """Cancel ``job_id``; see :meth:`tether.App.cancel`."""
        started = time.monotonic()
        metrics.cancellation_requested(force)
        job = await self._retry(lambda: self.store.get(job_id))
        if job is None:
            raise JobNotFoundError(job_id)
        cancellation_id = f"cancel-{secrets.token_hex(6)}"
        if request_id is None and job.state in LIVE:
            # Ask first, so the worker hears of it now; the record follows. A request is
            # idempotent, so a concurrent one changes nothing, and the record (one per
            # job while in progress) shows which request leads. Every store call is
            # retried: one transient fault must not fail the cancellation.
            try:
                requested = await self._retry(
                    lambda: self.store.request_cancel(job_id, reason, force, actor, cascade)
                )
            except StoreError as exc:
                await self._record_refusal(
                    cancellation_id, job, reason, force, cascade, actor, exc, started
                )
                raise
            row, created = await self._retry(
                lambda: self.store.create_cancellation(
                    cancellation_id, job_id, None, reason, force, cascade, actor
                )
            )
            # Not created, yet ours: an earlier try committed but its answer was lost.
            if created or row.id == cancellation_id:
                return await self._run(row, job, wait, started, requested)
            return await self._follow(job, wait, started)
        existing = await self._retry(
            lambda: self.store.get_cancellation(job_id=job_id, request_id=request_id)
        )
        if existing is not None and existing.job_id != job_id:
            raise InvalidJobError(
                f"request id {request_id!r} belongs to the cancellation of job {existing.job_id}"
            )
        if existing is not None and existing.status in FINAL and job.state is JobState.FAILED:
            # Cancelling a failed job again dismisses it (failed -> cancelled), which
            # frees a key it holds; the record gains a step saying so.
            return await self._dismiss(record_from_row(existing), job, started)
        if existing is None and job.state is JobState.SUCCEEDED:
            raise IllegalTransitionError(job_id, job.state.value, "cancel")
        if existing is None and job.state is JobState.CANCELLED:
            return _summary(job, "already_cancelled", started)
        if existing is None:
            row, created = await self._retry(
                lambda: self.store.create_cancellation(
                    cancellation_id, job_id, request_id, reason, force, cascade, actor
                )
            )
            if created or row.id == cancellation_id:
                return await self._run(row, job, wait, started)
        return await self._follow(job, wait, started)

    async def _record_refusal(
        self,
        cancellation_id: str,
        job: Job,
        reason: str,
        force: bool,
        cascade: bool,
        actor: str | None,
        exc: StoreError,
        started: float,
    ) -> None:
        """The request itself failed after every retry: record the cancellation as
        ``failed`` with the error (the caller gets the error too). If even that cannot
        be written, the follow-up settles what was written later."""
        t0 = _now()
        cause = f"{type(exc).__name__}: {exc}"
        log.error("cancellation of job %d: could not ask for it (%s); it failed", job.id, cause)
        try:
            row, created = await self._retry(
                lambda: self.store.create_cancellation(
                    cancellation_id, job.id, None, reason, force, cascade, actor
                )
            )
            if not (created or row.id == cancellation_id):
                return  # another cancellation of the job leads; it stands
            step = CancellationStep(
                "request", "failed", t0, _now(), {"state_before": job.state.value}, cause
            )
            result: dict[str, Any] = {
                "errors": [cause],
                "duration_seconds": round(time.monotonic() - started, 6),
            }
            if await self._retry(
                lambda: self.store.update_cancellation(
                    cancellation_id,
                    "failed",
                    [dataclasses.asdict(step)],
                    result,
                    cause,
                    True,
                    expect="initiated",
                )
            ):
                metrics.cancellation_finished("failed", result)
        except StoreError as again:
            log.error("cancellation of job %d: could not record its failure: %s", job.id, again)

    async def _follow(self, job: Job, wait: float, started: float) -> CancellationResult:
        """Another request got there first: answer with its record, once it settles."""
        job_id = job.id
        record = await self.wait_settled(job_id, wait)
        final = await self.store.get(job_id)
        assert record is not None and final is not None
        answer = _from_record(record, final, started)
        if answer.outcome == "cancelled" and job.state is JobState.CANCELLED:
            answer = dataclasses.replace(answer, outcome="already_cancelled")
        return answer

    async def _run(
        self,
        row: CancellationRow,
        job: Job,
        wait: float,
        started: float,
        requested: Job | None = None,
    ) -> CancellationResult:
        steps: list[CancellationStep] = []
        errors: list[str] = []
        status = "completed"
        result: dict[str, Any] = {}
        current = row.status
        doing = "request"  # the step under way, for a record that ends failed

        async def progress(step: CancellationStep, next_status: str) -> None:
            nonlocal current, doing
            doing = f"record {step.name}"
            steps.append(step)
            written = await self._retry(
                lambda: self.store.update_cancellation(
                    row.id,
                    next_status,
                    [dataclasses.asdict(s) for s in steps],
                    None,
                    None,
                    False,
                    expect=current,
                )
            )
            if not written:
                raise _Superseded
            current = next_status
            doing = next_status

        try:
            # 1. Stop new assignment: cancel what is not running, flag what is, and (with
            #    cascade) everything downstream, in the same transaction.
            t0 = _now()
            before = job.state
            if requested is None:
                requested = await self._retry(
                    functools.partial(
                        self.store.request_cancel,
                        row.job_id,
                        row.reason,
                        row.force,
                        row.initiated_by,
                        row.cascade,
                    )
                )
            job = requested
            downstream = await self._retry(lambda: self.store.downstream([job.id]))
            targets = [job.id, *(d.id for d in downstream)] if row.cascade else [job.id]
            await progress(
                CancellationStep(
                    "request",
                    "completed",
                    t0,
                    _now(),
                    {
                        "state_before": before.value,
                        "state_after": job.display_state,
                        "cascade": row.cascade,
                        "downstream": [d.id for d in downstream],
                        # How long this request waits for the runners: a record older
                        # than that (and the adoption bound) has lost its canceller.
                        "wait": wait,
                    },
                ),
                "stopping_runners",
            )
            # 2. Stop the runners, if there are any (bounded).
            t0 = _now()
            final = await self._settle(targets, wait)
            running = [j for j in final if j.state is JobState.RUNNING]
            was_running = {d.id for d in downstream if d.state is JobState.RUNNING}
            if before is JobState.RUNNING:
                was_running.add(job.id)
            # A job that succeeded ended on its own, before the request reached it:
            # there was no runner left to stop.
            stopped = [
                j
                for j in final
                if j.state not in (JobState.RUNNING, JobState.SUCCEEDED)
                and (j.id in was_running or j.stopped_by in STOPPED | {"abandoned"})
            ]
            runners = [f"job {j.id} on {j.worker_id} ({j.stopped_by})" for j in stopped]
            for j in running:
                errors.append(
                    f"job {j.id} still running after {wait:g}s; it cannot run again and ends "
                    "cancelled when its worker stops or its lease expires"
                )
            for j in stopped:
                if j.stopped_by == "abandoned":
                    errors.append(
                        f"job {j.id}'s handler ignored cancellation and was abandoned: its "
                        "lease was revoked, so nothing it writes counts, but it may still run"
                    )
            had_runner = before is JobState.RUNNING or bool(stopped)
            await progress(
                CancellationStep(
                    "stop_runners",
                    "failed" if running else ("completed" if had_runner else "skipped"),
                    t0,
                    _now(),
                    {"runners_terminated": runners, "still_running": [j.id for j in running]},
                    "; ".join(errors) if running else None,
                ),
                "updating_tasks",
            )
            # 3. What became of the tasks: completed work is preserved, never undone.
            t0 = _now()
            cancelled = [j.id for j in final if j.state is JobState.CANCELLED]
            completed = [j.id for j in final if j.state is JobState.SUCCEEDED]
            failed = [j.id for j in final if j.state is JobState.FAILED]
            blocked = [d.id for d in downstream if d.state is JobState.BLOCKED and not row.cascade]
            await progress(
                CancellationStep(
                    "update_tasks",
                    "completed",
                    t0,
                    _now(),
                    {
                        "cancelled": cancelled,
                        "completed": completed,
                        "failed": failed,
                        "dependents_blocked": blocked,
                    },
                ),
                "cleaning_resources",
            )
            # 4. Resources: the database releases slots as each job leaves running.
            t0 = _now()
            released = sorted(
                {lim for j in final if j.state is not JobState.RUNNING for lim in j.limits}
                if had_runner
                else set()
            )
            # Only a job that ran can have saved artifacts.
            artifacts = await self._artifacts(final)
            await progress(
                CancellationStep(
                    "clean_resources",
                    "completed",
                    t0,
                    _now(),
                    {"slots_released": released, "artifacts_preserved": artifacts},
                ),
                "cleaning_resources",
            )
            if errors:
                status = "partial"
            result = {
                "tasks_cancelled": cancelled,
                "tasks_completed": completed,
                "tasks_failed": failed,
                "runners_terminated": runners,
                "slots_released": released,
                "artifacts_preserved": artifacts,
                "dependents_blocked": blocked,
                "errors": errors,
            }
        except _Superseded:
            return await self._answer(job, started)
        except StoreError as exc:
            # A store fault that outlasted every retry (each call was retried).
            return await self._fail(row, job, steps, current, doing, exc, started)
        except Exception as exc:
            # The job states, not this error, decide how the record ends: a job that is
            # in fact cancelled with nothing left to do is not a failed cancellation.
            cause = f"{type(exc).__name__}: {exc}"
            log.warning("cancellation %s: %s; settling it from the job states", row.id, cause)
            with contextlib.suppress(Exception):
                latest_row = await self._retry(
                    lambda: self.store.get_cancellation(job_id=job.id, request_id=None)
                )
                if latest_row is not None and latest_row.id == row.id:
                    await self._adopt(record_from_row(latest_row), f"the canceller met {cause}")
            # If even that failed, the record stays open and a follow-up adopts it later.
            return await self._answer(job, started, cause)
        result["duration_seconds"] = round(time.monotonic() - started, 6)
        metrics.cancellation_finished(status, result)
        try:
            written = await self._retry(
                lambda: self.store.update_cancellation(
                    row.id,
                    status,
                    [dataclasses.asdict(s) for s in steps],
                    result,
                    "; ".join(errors) or None,
                    True,
                    expect=current,
                )
            )
        except StoreError as exc:
            return await self._fail(row, job, steps, current, "record the result", exc, started)
        if not written:
            return await self._answer(job, started)
        latest = await self.store.get(job.id) or job
        record = await self.store.get_cancellation(job_id=job.id, request_id=None)
        assert record is not None
        return _from_record(record_from_row(record), latest, started)

    async def _fail(
        self,
        row: CancellationRow,
        job: Job,
        steps: list[CancellationStep],
        current: str,
        doing: str,
        exc: StoreError,
        started: float,
    ) -> CancellationResult:
        """End the record ``failed`` with the store's error once the retries are spent.

        The steps done so far stay, followed by one that names what failed. If even this
        write fails, the record stays open and the follow-up settles it later (see
        :meth:`adopt_stale`).
        """
        cause = f"{type(exc).__name__}: {exc}"
        tries = self._retry_policy.attempts
        log.error(
            "cancellation %s: %s failed %d times (%s); it failed", row.id, doing, tries, cause
        )
        now = _now()
        failed = CancellationStep("store_fault", "failed", now, now, {"during": doing}, cause)
        result: dict[str, Any] = {
            "errors": [cause],
            "duration_seconds": round(time.monotonic() - started, 6),
        }
        try:
            if await self._retry(
                lambda: self.store.update_cancellation(
                    row.id,
                    "failed",
                    [*(dataclasses.asdict(s) for s in steps), dataclasses.asdict(failed)],
                    result,
                    cause,
                    True,
                    expect=current,
                )
            ):
                metrics.cancellation_finished("failed", result)
        except StoreError as again:
            log.error("cancellation %s: could not record its failure either: %s", row.id, again)
        return await self._answer(job, started, cause)

    async def _answer(
        self, job: Job, started: float, error: str | None = None
    ) -> CancellationResult:
        """The answer from the record as it stands (somebody else may have settled it)."""
        try:
            latest = await self._retry(lambda: self.store.get(job.id)) or job
            row = await self._retry(
                lambda: self.store.get_cancellation(job_id=job.id, request_id=None)
            )
        except StoreError as exc:
            latest, row = job, None
            error = error or f"{type(exc).__name__}: {exc}"
        if row is None:
            return dataclasses.replace(
                _summary(job, "requested", started),
                status="initiated",
                success=False,
                errors=[error or "no cancellation record"],
            )
        answer = _from_record(record_from_row(row), latest, started)
        if error is not None and not record_from_row(row).settled:
            answer = dataclasses.replace(answer, errors=[*answer.errors, error])
        return answer

    async def _artifacts(self, jobs: list[Job]) -> list[str]:
        # Only a job that ran can have saved artifacts.
        found: list[str] = []
        for target in jobs:
            if target.started_at is not None:
                listed = await self._retry(functools.partial(self.store.list_artifacts, target.id))
                found += [f"{a.job_id}/{a.name}" for a in listed]
        return found

    async def adopt_stale(self, limit: int = 100) -> list[str]:
        """Settle, from the job states, the records nobody settled: older than the
        adoption bound plus the wait their canceller asked for (it died, or lost the
        database on the way). Returns their ids."""
        done: list[str] = []
        for row in await self.store.list_stale_cancellations(self._adopt_after, limit):
            record = record_from_row(row)
            if not self._stale(record):
                continue  # its canceller may still be waiting, as it was asked to
            try:
                if await self._adopt(record, "nobody settled it: its canceller is gone"):
                    done.append(record.id)
            except RowLocked as exc:
                # A row another client holds: this record waits for the next round, the
                # others go on now.
                log.info("cancellation %s: %s; trying again next round", record.id, exc)
        return done

    def _stale(self, record: CancellationRecord) -> bool:
        waited = max(
            (float(s.details.get("wait", 0)) for s in record.steps if s.name == "request"),
            default=0.0,
        )
        age = (datetime.now(UTC) - record.initiated_at).total_seconds()
        return not record.settled and age >= self._adopt_after + waited

    async def _adopt(self, record: CancellationRecord, why: str) -> bool:
        """Settle an open record from the job states, with a step saying so; ``False``
        if somebody else settled it first."""
        t0 = _now()
        job = await self._retry(lambda: self.store.get(record.job_id))
        errors: list[str] = []
        result: dict[str, Any]
        details: dict[str, Any] = {"previous_status": record.status, "why": why}
        if job is None:
            errors += [f"job {record.job_id} no longer exists", why]
            result = {"errors": errors}
        else:
            if record.status == "initiated" and job.state in LIVE:
                # Its canceller may have died before it asked: ask now (idempotent).
                job = await self._retry(
                    lambda: self.store.request_cancel(
                        record.job_id,
                        record.reason,
                        record.force,
                        record.initiated_by,
                        record.cascade,
                    )
                )
            downstream = await self._retry(lambda: self.store.downstream([record.job_id]))
            targets = (
                [record.job_id, *(d.id for d in downstream)] if record.cascade else [record.job_id]
            )
            final = await self._read(targets)
            running = [j for j in final if j.state is JobState.RUNNING]
            runners = [
                f"job {j.id} on {j.worker_id} ({j.stopped_by})"
                for j in final
                if j.state is not JobState.RUNNING and j.stopped_by
            ]
            for j in running:
                errors.append(
                    f"job {j.id} still running when its cancellation was settled; it cannot "
                    "run again and ends cancelled when its worker stops or its lease expires"
                )
            for j in final:
                if j.stopped_by == "abandoned" and j.state is not JobState.RUNNING:
                    errors.append(
                        f"job {j.id}'s handler ignored cancellation and was abandoned: its "
                        "lease was revoked, so nothing it writes counts, but it may still run"
                    )
            details |= {
                "ended": {str(j.id): j.state.value for j in final if j not in running},
                "still_running": [j.id for j in running],
                "runners_terminated": runners,
            }
            result = {
                "tasks_cancelled": [j.id for j in final if j.state is JobState.CANCELLED],
                "tasks_completed": [j.id for j in final if j.state is JobState.SUCCEEDED],
                "tasks_failed": [j.id for j in final if j.state is JobState.FAILED],
                "runners_terminated": runners,
                "slots_released": sorted(
                    {lim for j in final if j.stopped_by and j not in running for lim in j.limits}
                ),
                "artifacts_preserved": await self._artifacts(final),
                "dependents_blocked": [
                    d.id for d in downstream if d.state is JobState.BLOCKED and not record.cascade
                ],
                "errors": errors,
            }
        status = "failed" if job is None else ("partial" if errors else "completed")
        result["duration_seconds"] = round(
            (datetime.now(UTC) - record.initiated_at).total_seconds(), 6
        )
        step = CancellationStep(SETTLE_STEP, "completed", t0, _now(), details)
        written = await self._retry(
            lambda: self.store.update_cancellation(
                record.id,
                status,
                [*(dataclasses.asdict(s) for s in record.steps), dataclasses.asdict(step)],
                result,
                "; ".join(errors) or None,
                True,
                expect=record.status,
            )
        )
        if written:
            metrics.cancellation_finished(status, result)
        return written

    async def _dismiss(
        self, record: CancellationRecord, job: Job, started: float
    ) -> CancellationResult:
        t0 = _now()
        job = await self.store.request_cancel(
            job.id, record.reason, record.force, record.initiated_by, record.cascade
        )
        step = CancellationStep(
            "dismiss", "completed", t0, _now(), {"state_before": "failed", "state_after": job.state}
        )
        result = dict(record.result or {})
        result["tasks_cancelled"] = sorted({*result.get("tasks_cancelled", []), job.id})
        result["tasks_failed"] = [i for i in result.get("tasks_failed", []) if i != job.id]
        await self.store.update_cancellation(
            record.id,
            "completed",
            [*(dataclasses.asdict(s) for s in record.steps), dataclasses.asdict(step)],
            result,
            None,
            True,
        )
        row = await self.store.get_cancellation(job_id=job.id, request_id=None)
        assert row is not None
        return _from_record(record_from_row(row), job, started)

    async def follow_up(self, limit: int = 100) -> list[str]:
        """Complete ``partial`` records whose only trouble was a job still running when
        the request stopped waiting, once every such job has stopped; returns their ids.

        ``cancel(wait=0)`` on a running job settles its record at once, as ``partial``;
        without this, the record would say so after the job ended cancelled.
        """
        done: list[str] = []
        for row in await self.store.list_cancellations(limit, 0, status="partial"):
            record = record_from_row(row)
            try:
                if await self._follow_up_one(record):
                    done.append(record.id)
            except RowLocked as exc:  # as in adopt_stale
                log.info("cancellation %s: %s; trying again next round", record.id, exc)
        return done

    async def _follow_up_one(self, record: CancellationRecord) -> bool:
        """Complete one partial record if the jobs it waited for have all stopped."""
        waited = _waited(record)
        if not waited:
            return False  # followed up already, or partial for another reason
        jobs = await self._read(waited)
        if any(j.state is JobState.RUNNING for j in jobs):
            return False
        return await self._complete_follow_up(record, jobs)

    async def _complete_follow_up(self, record: CancellationRecord, jobs: list[Job]) -> bool:
        ids = {j.id for j in jobs}
        result = dict(record.result or {})
        errors = [
            e
            for e in result.get("errors", [])
            if not any(e.startswith(f"job {i} still running") for i in ids)
        ]
        ended = {str(j.id): j.state.value for j in jobs}
        runners = [f"job {j.id} on {j.worker_id} ({j.stopped_by})" for j in jobs if j.stopped_by]
        step = CancellationStep(
            "follow_up",
            "completed",
            _now(),
            _now(),
            {"ended": ended, "runners_terminated": runners},
        )
        for key, state in (
            ("tasks_cancelled", JobState.CANCELLED),
            ("tasks_completed", JobState.SUCCEEDED),
            ("tasks_failed", JobState.FAILED),
        ):
            result[key] = sorted({*result.get(key, []), *(j.id for j in jobs if j.state is state)})
        result["runners_terminated"] = sorted({*result.get("runners_terminated", []), *runners})
        result["errors"] = errors
        return await self._retry(
            lambda: self.store.update_cancellation(
                record.id,
                "partial" if errors else "completed",
                [*(dataclasses.asdict(s) for s in record.steps), dataclasses.asdict(step)],
                result,
                "; ".join(errors) or None,
                True,
                expect="partial",
            )
        )

    async def _settle(self, ids: list[int], timeout: float) -> list[Job]:
        """The jobs once none of them runs any more, or as they are at ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with self.store.hints.subscribe(h.CHANGED, [str(i) for i in ids]) as sub:
            while True:
                jobs = await self._read(ids)
                left = deadline - loop.time()
                if left <= 0 or all(j.state is not JobState.RUNNING for j in jobs):
                    return jobs
                await sub.get(min(self._poll, left))

    async def _read(self, ids: list[int]) -> list[Job]:
        """The jobs with these ids, in a few queries however many there are."""
        jobs: list[Job] = []
        for i in range(0, len(ids), READ_CHUNK):
            part = tuple(ids[i : i + READ_CHUNK])
            query = JobFilter(ids=part, limit=len(part))
            jobs += await self._retry(functools.partial(self.store.list_jobs, query))
        return sorted(jobs, key=lambda j: j.id)

    async def wait_settled(self, job_id: int, timeout: float) -> CancellationRecord | None:
        """The job's cancellation record once it has settled and the jobs it waited for
        have stopped, or as it is at ``timeout``.

        A record that settled ``partial`` while its job still ran is completed here as
        soon as the job stops (the follow-up's work, done at once), so an error that
        no longer holds is never reported as current; a record whose canceller is gone
        is settled from the job states once it is older than the adoption bound.
        """
        await self.store.listen()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with self.store.hints.subscribe(h.CHANGED, [str(job_id)]) as sub:
            while True:
                record = await self._current(job_id)
                if record is not None and record.settled and _waited(record):
                    if await self._follow_up_one(record):
                        record = await self._current(job_id)
                elif record is not None and self._stale(record):
                    await self._adopt(record, "nobody settled it: its canceller is gone")
                    record = await self._current(job_id)
                left = deadline - loop.time()
                done = record is not None and record.settled and not _waited(record)
                if done or left <= 0:
                    return record
                await sub.get(min(self._poll, left))

    async def _current(self, job_id: int) -> CancellationRecord | None:
        row = await self._retry(lambda: self.store.get_cancellation(job_id=job_id, request_id=None))
        return record_from_row(row) if row is not None else None


def _waited(record: CancellationRecord) -> list[int]:
    """The jobs a partial record still waits for (none once followed up)."""
    if record.status != "partial" or any(s.name == "follow_up" for s in record.steps):
        return []
    return [i for s in record.steps for i in s.details.get("still_running", [])]


def _summary(job: Job, outcome: Outcome, started: float) -> CancellationResult:
    return CancellationResult(
        cancellation_id="",
        job_id=job.id,
        status="completed",
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


def _outcome(job: Job) -> Outcome:
    if job.state is JobState.CANCELLED:
        return "cancelled"
    if job.state is JobState.SUCCEEDED:
        return "finished_first"
    if job.state is JobState.FAILED and job.budget is not None and job.usage > job.budget:
        return "failed_over_budget"
    if job.state is JobState.FAILED:
        return "finished_first"
    return "requested"


def _from_record(record: CancellationRecord, job: Job, started: float) -> CancellationResult:
    result = record.result or {}
    return CancellationResult(
        cancellation_id=record.id,
        job_id=record.job_id,
        status=record.status,
        outcome=_outcome(job),
        job=job,
        success=record.status == "completed",
        tasks_cancelled=list(result.get("tasks_cancelled", [])),
        tasks_completed=list(result.get("tasks_completed", [])),
        tasks_failed=list(result.get("tasks_failed", [])),
        runners_terminated=list(result.get("runners_terminated", [])),
        slots_released=list(result.get("slots_released", [])),
        artifacts_preserved=list(result.get("artifacts_preserved", [])),
        dependents_blocked=list(result.get("dependents_blocked", [])),
        errors=list(result.get("errors", [])) or ([record.error] if record.error else []),
        duration_seconds=float(result.get("duration_seconds", time.monotonic() - started)),
        steps=record.steps,
    )
