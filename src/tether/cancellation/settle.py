"""Settling a record its canceller no longer drives: adopting an open record whose
canceller is gone, and following up a ``partial`` one once its jobs have stopped.

Both count what happened with the same tally and tell it in the same words as the
canceller's own steps (:mod:`tether.cancellation.wording`).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from tether import metrics
from tether.cancellation import wording
from tether.cancellation.calls import Calls
from tether.cancellation.records import (
    CancellationRecord,
    CancellationSummary,
    Status,
    timestamp,
)
from tether.cancellation.steps import log_step
from tether.cancellation.tally import LIVE, tally
from tether.states import JobState


def waited(record: CancellationRecord) -> list[int]:
    """The jobs a partial record still waits for (none once followed up)."""
    if record.status is not Status.PARTIAL or any(s.name == "follow_up" for s in record.steps):
        return []
    return [i for s in record.steps for i in s.details.get("still_running", [])]


def stale(record: CancellationRecord, adopt_after: float) -> bool:
    """Whether an open record has lost its canceller: older than ``adopt_after`` plus the
    wait its canceller asked for."""
    wait = max(
        (float(s.details.get("wait", 0)) for s in record.steps if s.name == "request"),
        default=0.0,
    )
    age = (datetime.now(UTC) - record.initiated_at).total_seconds()
    return not record.settled and age >= adopt_after + wait


class Settler:
    """Settles the records their cancellers no longer drive."""

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self.store = calls.store

    async def adopt(self, record: CancellationRecord, why: str) -> bool:
        """Settle an open record from the job states, with a step saying so; ``False``
        if somebody else settled it first."""
        retry = self._calls.retry
        t0 = timestamp()
        job = await retry(lambda: self.store.get(record.job_id))
        if job is None:
            problems = [f"job {record.job_id} no longer exists", why]
            status = Status.FAILED
            result = CancellationSummary(errors=problems)
            step = wording.settled(None, [], record.status, why, t0)
        else:
            if record.status is Status.INITIATED and job.state in LIVE:
                # Its canceller may have died before it asked: ask now (idempotent).
                job = await retry(
                    lambda: self.store.request_cancel(
                        record.job_id,
                        record.reason,
                        record.force,
                        record.initiated_by,
                        record.cascade,
                    )
                )
            downstream = await retry(lambda: self.store.downstream([record.job_id]))
            targets = [record.job_id]
            if record.cascade:
                targets += [d.id for d in downstream]
            final = await self._calls.read(targets)
            # Nobody saw these jobs when they were asked: a job its worker says it
            # stopped was running.
            was_running = {j.id for j in final if j.stopped_by}
            seen = tally(
                record.job_id, final, downstream, was_running=was_running, cascade=record.cascade
            )
            problems = wording.errors(seen, wording.WHEN_SETTLED)
            status = wording.ending(problems)
            result = wording.summary(seen, await self._calls.artifacts(final), problems)
            step = wording.settled(seen, final, record.status, why, t0)
        age = (datetime.now(UTC) - record.initiated_at).total_seconds()
        result = dataclasses.replace(result, duration_seconds=round(age, 6))
        written = await self._calls.write(
            record.id,
            status,
            [*record.steps, step],
            result,
            error="; ".join(problems) or None,
            expect=record.status,
        )
        if written:
            log_step(record, step)
            metrics.cancellation_finished(status, result)
        return written

    async def follow_up(self, record: CancellationRecord) -> bool:
        """Complete one partial record if the jobs it waited for have all stopped."""
        ids = waited(record)
        if not ids:
            return False  # followed up already, or partial for another reason
        jobs = await self._calls.read(ids)
        if any(j.state is JobState.RUNNING for j in jobs):
            return False
        seen = tally(
            record.job_id,
            jobs,
            [],
            was_running={j.id for j in jobs if j.stopped_by},
            cascade=record.cascade,
        )
        previous = record.result or CancellationSummary()
        problems = [
            e
            for e in previous.errors or []
            if not any(wording.is_still_running(e, j.id) for j in jobs)
        ]
        step = wording.followed_up(seen, jobs)
        result = wording.followed_up_summary(previous, seen, problems)
        written = await self._calls.write(
            record.id,
            wording.ending(problems),
            [*record.steps, step],
            result,
            error="; ".join(problems) or None,
            expect=Status.PARTIAL,
        )
        if written:
            log_step(record, step)
        return written
