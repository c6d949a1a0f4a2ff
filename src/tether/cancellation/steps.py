"""The four steps of a cancellation, as its canceller drives its record through them."""

from __future__ import annotations

import functools
import logging

from tether.cancellation import wording
from tether.cancellation.calls import Calls
from tether.cancellation.records import CancellationRecord, CancellationStep, Status, timestamp
from tether.cancellation.tally import Tally, tally
from tether.job import CancellationRow, Job
from tether.logs import job_fields
from tether.states import JobState

log = logging.getLogger("tether.cancellation")


class Superseded(Exception):
    """Somebody else settled the record meanwhile (a follow-up that adopted it)."""


class Run:
    """One cancellation as its canceller drives it: the job as it was asked to stop
    (``asked``) and as it is since (``job``), the steps recorded so far, the status last
    written, and what is under way (``doing``, named by a record that ends ``failed``).
    """

    def __init__(self, calls: Calls, row: CancellationRow, asked: Job, started: float) -> None:
        self._calls = calls
        self.row = row
        self.asked = asked
        self.job = asked
        self.started = started
        self.steps: list[CancellationStep] = []
        self.current = Status(row.status)
        self.doing = "request"

    async def _progress(self, step: CancellationStep, next_status: Status) -> None:
        """Record ``step`` and move the record on to ``next_status``; raises
        :class:`Superseded` if somebody else settled it meanwhile."""
        self.doing = f"record {step.name}"
        self.steps.append(step)
        written = await self._calls.write(
            self.row.id, next_status, self.steps, None, error=None, expect=self.current
        )
        if not written:
            raise Superseded
        log_step(self.row, step)
        self.current = next_status
        self.doing = next_status.value

    async def request(self, wait: float, requested: Job | None) -> list[Job]:
        """1. Stop new assignment: cancel what is not running, flag what is, and (with
        cascade) everything downstream, in the same transaction (unless the canceller
        asked already: ``requested``). Returns the jobs downstream, as they are once
        asked."""
        t0 = timestamp()
        row = self.row
        if requested is None:
            requested = await self._calls.retry(
                functools.partial(
                    self._calls.store.request_cancel,
                    row.job_id,
                    row.reason,
                    row.force,
                    row.initiated_by,
                    row.cascade,
                )
            )
        self.job = job = requested
        downstream = await self._calls.retry(lambda: self._calls.store.downstream([job.id]))
        step = wording.request(self.asked, job, downstream, row.cascade, wait, t0)
        await self._progress(step, Status.STOPPING_RUNNERS)
        return downstream

    async def stop_runners(
        self, downstream: list[Job], wait: float
    ) -> tuple[list[Job], Tally, list[str]]:
        """2. Stop the runners, if there are any (waiting ``wait`` at most). Returns the
        jobs as they are then, their tally, and the errors it leaves."""
        t0 = timestamp()
        targets = [self.job.id]
        if self.row.cascade:
            targets += [d.id for d in downstream]
        final = await self._calls.stopped(targets, wait)
        was_running = {d.id for d in downstream if d.state is JobState.RUNNING}
        if self.asked.state is JobState.RUNNING:
            was_running.add(self.job.id)
        seen = tally(
            self.job.id, final, downstream, was_running=was_running, cascade=self.row.cascade
        )
        problems = wording.errors(seen, wording.after(wait))
        await self._progress(wording.stop_runners(seen, problems, t0), Status.UPDATING_TASKS)
        return final, seen, problems

    async def update_tasks(self, seen: Tally) -> None:
        """3. What became of the tasks: completed work is preserved, never undone."""
        step = wording.update_tasks(seen, timestamp())
        await self._progress(step, Status.CLEANING_RESOURCES)

    async def clean_resources(self, final: list[Job], seen: Tally) -> list[str]:
        """4. Resources: the database releases slots as each job leaves running; the
        artifacts are kept. Returns them."""
        t0 = timestamp()
        artifacts = await self._calls.artifacts(final)
        await self._progress(
            wording.clean_resources(seen, artifacts, t0), Status.CLEANING_RESOURCES
        )
        return artifacts


def log_step(row: CancellationRow | CancellationRecord, step: CancellationStep) -> None:
    """Log one step of a cancellation, with its id, job and reason: at INFO, or WARNING
    if it failed."""
    details = ", ".join(f"{k}={v}" for k, v in step.details.items() if v not in (None, [], {}))
    log.log(
        logging.WARNING if step.status == "failed" else logging.INFO,
        "cancellation %s of job %s (%s): %s %s%s%s",
        row.id,
        row.job_id,
        row.reason,
        step.name,
        step.status,
        f" [{details}]" if details else "",
        f": {step.error}" if step.error else "",
        extra=job_fields(
            "cancellation_step",
            cancellation_id=row.id,
            job_id=row.job_id,
            reason=row.reason,
            step=step.name,
            status=step.status,
        ),
    )
