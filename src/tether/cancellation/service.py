"""The cancellation service: cancels a job and drives its record, step by step."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from tether import hints as h
from tether import metrics
from tether.cancellation import answers, wording
from tether.cancellation.calls import Calls, CancellationBackend
from tether.cancellation.records import (
    CancellationRecord,
    CancellationResult,
    CancellationStep,
    CancellationSummary,
    Status,
    record_from_row,
    timestamp,
)
from tether.cancellation.settle import Settler, stale, waited
from tether.cancellation.steps import Run, Superseded
from tether.cancellation.tally import LIVE
from tether.config import StoreRetry
from tether.errors import (
    IllegalTransitionError,
    InvalidJobError,
    JobNotFoundError,
    RowLocked,
    StoreError,
)
from tether.job import CancellationRow, Job
from tether.logs import job_fields
from tether.states import JobState

#: A record nobody settled this long after it began (plus the wait its canceller asked
#: for) has lost its canceller: the follow-up settles it from the job states.
ADOPT_AFTER = 30.0
#: Retries of each store call before a record ends ``failed`` (AppConfig.cancellation_retry).
DEFAULT_RETRY = StoreRetry()
log = logging.getLogger("tether.cancellation")


class CancellationService:
    """Runs cancellations for an :class:`~tether.App` (see :mod:`tether.cancellation`)."""

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
        self._calls = Calls(store, poll_interval, retry)
        self._retry = self._calls.retry
        self._settler = Settler(self._calls)

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
        create = functools.partial(
            self.store.create_cancellation,
            cancellation_id,
            job_id=job_id,
            reason=reason,
            force=force,
            cascade=cascade,
            initiated_by=actor,
        )
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
                await self._record_refusal(cancellation_id, create, job, exc, started)
                raise
            row, created = await self._retry(lambda: create(request_id=None))
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
        if (
            existing is not None
            and Status(existing.status).settled
            and job.state is JobState.FAILED
        ):
            # Cancelling a failed job again dismisses it (failed -> cancelled), which
            # frees a key it holds; the record gains a step saying so.
            return await self._dismiss(record_from_row(existing), job, started)
        if existing is None and job.state is JobState.SUCCEEDED:
            raise IllegalTransitionError(job_id, job.state.value, "cancel")
        if existing is None and job.state is JobState.CANCELLED:
            return answers.at_once(job, "already_cancelled", started)
        if existing is None:
            row, created = await self._retry(lambda: create(request_id=request_id))
            if created or row.id == cancellation_id:
                return await self._run(row, job, wait, started)
        return await self._follow(job, wait, started)

    async def _record_refusal(
        self,
        cancellation_id: str,
        create: Callable[..., Awaitable[tuple[CancellationRow, bool]]],
        job: Job,
        exc: StoreError,
        started: float,
    ) -> None:
        """The request itself failed after every retry: record the cancellation as
        ``failed`` with the error (the caller gets the error too). If even that cannot
        be written, the follow-up settles what was written later."""
        t0 = timestamp()
        cause = f"{type(exc).__name__}: {exc}"
        log.error("cancellation of job %d: could not ask for it (%s); it failed", job.id, cause)
        try:
            row, created = await self._retry(lambda: create(request_id=None))
            if not (created or row.id == cancellation_id):
                return  # another cancellation of the job leads; it stands
            step = CancellationStep(
                "request",
                "failed",
                t0,
                timestamp(),
                {"state_before": job.state.value},
                cause,
            )
            result = CancellationSummary(
                errors=[cause], duration_seconds=round(time.monotonic() - started, 6)
            )
            if await self._calls.write(
                cancellation_id,
                Status.FAILED,
                [step],
                result,
                error=cause,
                expect=Status.INITIATED,
            ):
                metrics.cancellation_finished(Status.FAILED, result)
        except StoreError as again:
            log.error("cancellation of job %d: could not record its failure: %s", job.id, again)

    async def _follow(self, job: Job, wait: float, started: float) -> CancellationResult:
        """Another request got there first: answer with its record, once it settles."""
        job_id = job.id
        record = await self.wait_settled(job_id, wait)
        final = await self.store.get(job_id)
        assert record is not None and final is not None
        answer = answers.from_record(record, final, started)
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
        """Drive a new record through its four steps and settle it."""
        log.info(
            "cancellation %s of job %s (%s) initiated by %s: %s%s%s",
            row.id,
            row.job_id,
            job.state.value,
            row.initiated_by or "an unnamed caller",
            row.reason or "no reason given",
            " (force)" if row.force else "",
            " (cascade)" if row.cascade else "",
            extra=job_fields(
                "cancellation_initiated",
                cancellation_id=row.id,
                job_id=row.job_id,
                task=job.task,
                queue=job.queue,
                state=job.state.value,
                reason=row.reason,
            ),
        )
        run = Run(self._calls, row, job, started)
        try:
            downstream = await run.request(wait, requested)
            final, seen, problems = await run.stop_runners(downstream, wait)
            await run.update_tasks(seen)
            artifacts = await run.clean_resources(final, seen)
        except Superseded:
            return await self._answer(run.job, started)
        except StoreError as exc:
            # A store fault that outlasted every retry (each call was retried).
            return await self._fail(run, run.doing, exc)
        except Exception as exc:
            return await self._settle_after(run, exc)
        return await self._finish(run, wording.summary(seen, artifacts, problems))

    async def _finish(self, run: Run, said: CancellationSummary) -> CancellationResult:
        """Settle the record with what the steps counted."""
        status = wording.ending(said.errors or [])
        said = dataclasses.replace(said, duration_seconds=round(time.monotonic() - run.started, 6))
        metrics.cancellation_finished(status, said)
        try:
            written = await self._calls.write(
                run.row.id,
                status,
                run.steps,
                said,
                error="; ".join(said.errors or []) or None,
                expect=run.current,
            )
        except StoreError as exc:
            return await self._fail(run, "record the result", exc)
        if not written:
            return await self._answer(run.job, run.started)
        log.log(
            logging.INFO if status is Status.COMPLETED else logging.WARNING,
            "cancellation %s of job %s (%s): %s after %.3fs%s",
            run.row.id,
            run.row.job_id,
            run.row.reason,
            status.value,
            said.duration_seconds or 0.0,
            "".join(f"; {e}" for e in said.errors or []),
            extra=job_fields(
                "cancellation_finished",
                cancellation_id=run.row.id,
                job_id=run.row.job_id,
                reason=run.row.reason,
                status=status.value,
                duration=said.duration_seconds,
            ),
        )
        latest = await self.store.get(run.job.id) or run.job
        record = await self.store.get_cancellation(job_id=run.job.id, request_id=None)
        assert record is not None
        return answers.from_record(record_from_row(record), latest, run.started)

    async def _settle_after(self, run: Run, exc: Exception) -> CancellationResult:
        """An unexpected error: the job states, not this error, decide how the record
        ends. A job that is in fact cancelled with nothing left to do is not a failed
        cancellation."""
        cause = f"{type(exc).__name__}: {exc}"
        log.warning("cancellation %s: %s; settling it from the job states", run.row.id, cause)
        with contextlib.suppress(Exception):
            latest = await self._retry(
                lambda: self.store.get_cancellation(job_id=run.job.id, request_id=None)
            )
            if latest is not None and latest.id == run.row.id:
                await self._settler.adopt(record_from_row(latest), f"the canceller met {cause}")
        # If even that failed, the record stays open and a follow-up adopts it later.
        return await self._answer(run.job, run.started, cause)

    async def _fail(self, run: Run, doing: str, exc: StoreError) -> CancellationResult:
        """End the record ``failed`` with the store's error once the retries are spent.

        The steps done so far stay, followed by one that names what failed. If even this
        write fails, the record stays open and the follow-up settles it later (see
        :meth:`adopt_stale`).
        """
        cause = f"{type(exc).__name__}: {exc}"
        tries = self._calls.policy.attempts
        log.error(
            "cancellation %s: %s failed %d times (%s); it failed", run.row.id, doing, tries, cause
        )
        now = timestamp()
        failed = CancellationStep("store_fault", "failed", now, now, {"during": doing}, cause)
        result = CancellationSummary(
            errors=[cause], duration_seconds=round(time.monotonic() - run.started, 6)
        )
        try:
            if await self._calls.write(
                run.row.id,
                Status.FAILED,
                [*run.steps, failed],
                result,
                error=cause,
                expect=run.current,
            ):
                metrics.cancellation_finished(Status.FAILED, result)
        except StoreError as again:
            log.error("cancellation %s: could not record its failure either: %s", run.row.id, again)
        return await self._answer(run.job, run.started, cause)

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
                answers.at_once(job, "requested", started),
                status=Status.INITIATED,
                success=False,
                errors=[error or "no cancellation record"],
            )
        record = record_from_row(row)
        answer = answers.from_record(record, latest, started)
        if error is not None and not record.settled:
            answer = dataclasses.replace(answer, errors=[*answer.errors, error])
        return answer

    async def _dismiss(
        self, record: CancellationRecord, job: Job, started: float
    ) -> CancellationResult:
        t0 = timestamp()
        job = await self.store.request_cancel(
            job.id, record.reason, record.force, record.initiated_by, record.cascade
        )
        step = CancellationStep(
            "dismiss",
            "completed",
            t0,
            timestamp(),
            {"state_before": "failed", "state_after": job.state},
        )
        said = record.result or CancellationSummary()
        said = dataclasses.replace(
            said,
            tasks_cancelled=sorted({*(said.tasks_cancelled or []), job.id}),
            tasks_failed=[i for i in said.tasks_failed or [] if i != job.id],
        )
        await self.store.update_cancellation(
            record.id,
            status=Status.COMPLETED,
            steps=[*(s.to_json() for s in record.steps), step.to_json()],
            result=said.to_json(),
            error=None,
            final=True,
        )
        row = await self.store.get_cancellation(job_id=job.id, request_id=None)
        assert row is not None
        return answers.from_record(record_from_row(row), job, started)

    async def adopt_stale(self, limit: int = 100) -> list[str]:
        """Settle, from the job states, the records nobody settled: older than the
        adoption bound plus the wait their canceller asked for (it died, or lost the
        database on the way). Returns their ids."""
        done: list[str] = []
        for row in await self.store.list_stale_cancellations(
            older_than=self._adopt_after, limit=limit
        ):
            record = record_from_row(row)
            if not stale(record, self._adopt_after):
                continue  # its canceller may still be waiting, as it was asked to
            try:
                if await self._settler.adopt(record, wording.CANCELLER_GONE):
                    done.append(record.id)
            except RowLocked as exc:
                # A row another client holds: this record waits for the next round, the
                # others go on now.
                log.info("cancellation %s: %s; trying again next round", record.id, exc)
        return done

    async def follow_up(self, limit: int = 100) -> list[str]:
        """Complete ``partial`` records whose only trouble was a job still running when
        the request stopped waiting, once every such job has stopped; returns their ids.

        ``cancel(wait=0)`` on a running job settles its record at once, as ``partial``;
        without this, the record would say so after the job ended cancelled.
        """
        done: list[str] = []
        for row in await self.store.list_cancellations(
            limit=limit, offset=0, status=Status.PARTIAL
        ):
            record = record_from_row(row)
            try:
                if await self._settler.follow_up(record):
                    done.append(record.id)
            except RowLocked as exc:  # as in adopt_stale
                log.info("cancellation %s: %s; trying again next round", record.id, exc)
        return done

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
                if record is not None and record.settled and waited(record):
                    if await self._settler.follow_up(record):
                        record = await self._current(job_id)
                elif record is not None and stale(record, self._adopt_after):
                    await self._settler.adopt(record, wording.CANCELLER_GONE)
                    record = await self._current(job_id)
                left = deadline - loop.time()
                done = record is not None and record.settled and not waited(record)
                if done or left <= 0:
                    return record
                await sub.get(min(self._poll, left))

    async def _current(self, job_id: int) -> CancellationRecord | None:
        row = await self._retry(lambda: self.store.get_cancellation(job_id=job_id, request_id=None))
        return record_from_row(row) if row is not None else None
