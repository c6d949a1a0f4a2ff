"""Jobs: enqueue, list, read, history, cancel, pause, resume, retry, delete, durable steps
and signals."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query

from tether import display, job_meta
from tether.errors import JobNotFoundError
from tether.job import Job
from tether.states import TERMINAL, JobState
from tether.task import EnqueueOptions
from tether.web.body import JsonRoute
from tether.web.errors import ApiError
from tether.web.models import (
    MAX_ID,
    CancelIn,
    CancellationOut,
    CancellationRecordOut,
    CancellationStatus,
    Deleted,
    DurableStepList,
    DurableStepOut,
    EnqueueIn,
    EventList,
    EventOut,
    JobDetail,
    JobLogLineOut,
    JobLogList,
    JobOut,
    JobPage,
    JobRef,
    PauseIn,
    ResumeIn,
    SignalIn,
    SignalOut,
)
from tether.web.redact import for_member
from tether.web.routes import ERRORS
from tether.web.security import ALL_ROLES, WRITERS, Caller, require
from tether.web.settings import MAX_PAGE_SIZE

router = APIRouter(tags=["jobs"], responses=ERRORS, route_class=JsonRoute)

JobIdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="The job id.")]
NAME = r"^[^\x00-\x1f\x7f]+$"
NameQuery = Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME)]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="Page size (at most 1000).")]
Offset = Annotated[int, Query(ge=0, le=10**9)]
MAX_LISTED = 1000  # children and dependency ids shown with a job
# What of a cancellation may name other principals' jobs (redacted for members).
CANCEL_FIELDS = (
    "tasks_cancelled",
    "tasks_completed",
    "tasks_failed",
    "runners_terminated",
    "artifacts_preserved",
    "dependents_blocked",
    "errors",
    "steps",
)
RECORD_FIELDS = ("steps", "result", "error")

Reader = Annotated[Caller, Depends(require("job.read", ALL_ROLES))]


def _target(job_id: int) -> str:
    return f"job:{job_id}"


async def _visible_ids(caller: Caller, ids: list[int]) -> list[int]:
    """The ids among ``ids`` this caller may see (members: only their own jobs)."""
    ids = ids[:MAX_LISTED]
    if caller.principal.owner_filter is None:
        return ids
    visible = []
    for job_id in ids:
        with contextlib.suppress(JobNotFoundError):
            if caller.principal.sees(await caller.app.get(job_id)):
                visible.append(job_id)
    return visible


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobOut,
    summary="Enqueue a job",
    description="The caller owns the new job. Idempotency keys are the caller's own: a "
    "known `idempotency_key` returns the job the caller made with it; another principal's "
    "use of the same key is neither seen nor touched.",
)
async def enqueue(
    body: EnqueueIn,
    caller: Annotated[Caller, Depends(require("job.enqueue", WRITERS))],
) -> JobOut:
    async with caller.attempt(f"task:{body.task}", mutation=True) as att:
        if caller.principal.owner_filter is not None:
            for dep in body.depends_on:
                try:
                    await caller.job(dep)
                except ApiError as exc:
                    # Same answer as for an id that does not exist: no leaking of ids.
                    raise ApiError(
                        422, "invalid_job", f"unknown dependency id(s): {dep}", denied=exc.denied
                    ) from None
        if "\\u0000" in json.dumps(body.args):
            raise ApiError(422, "invalid_job", "args must not contain NUL characters")
        opts = EnqueueOptions(
            queue=body.queue,
            priority=body.priority,
            key=body.key,
            delay=body.delay,
            max_attempts=body.max_attempts,
            timeout=body.timeout,
            idempotency_key=body.idempotency_key,
            owner=caller.principal.name,
            budget=body.budget,
            depends_on=tuple(body.depends_on),
            meta=body.meta,
        )
        job = await caller.app.enqueue(body.task, body.args, opts)
        att.target = _target(job.id)
    return JobOut.of(job)


@router.get("/jobs", response_model=JobPage, summary="List jobs, newest first")
async def list_jobs(
    caller: Annotated[Caller, Depends(require("job.list", ALL_ROLES))],
    state: Annotated[list[JobState] | None, Query(description="Repeatable.")] = None,
    queue: NameQuery = None,
    task: NameQuery = None,
    key: NameQuery = None,
    owner: NameQuery = None,
    parent: Annotated[int | None, Query(ge=1, le=MAX_ID, description="Parent job id.")] = None,
    worker: NameQuery = None,
    meta: Annotated[
        list[str] | None,
        Query(
            max_length=32,
            description="Only jobs whose meta has this `key:value` (repeatable: all of them).",
        ),
    ] = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> JobPage:
    forced = caller.principal.owner_filter
    if forced is not None and owner is not None and owner != forced:
        jobs: list[Job] = []  # a member sees only its own jobs, whatever it asks for
    else:
        jobs = await caller.app.jobs.list(
            state=list(state) if state else None,
            queue=queue,
            task=task,
            key=key,
            owner=forced or owner,
            worker_id=worker,
            parent_id=parent,
            meta=job_meta.parse_pairs(meta or (), sep=":"),
            limit=limit,
            offset=offset,
        )
    return JobPage(
        items=[JobOut.of(j) for j in jobs],
        limit=limit,
        offset=offset,
        next_offset=offset + limit if len(jobs) == limit else None,
    )


@router.get(
    "/jobs/{job_id}",
    response_model=JobDetail,
    summary="One job, with its lease, requests, progress, children and dependencies",
)
async def get_job(job_id: JobIdPath, caller: Reader) -> JobDetail:
    async with caller.attempt(_target(job_id), mutation=False):
        job = await caller.job(job_id)
    children = [c for c in await caller.app.jobs.children(job_id) if caller.principal.sees(c)]
    upstream, downstream = await caller.app.jobs.dependencies(job_id)
    return JobDetail(
        **JobOut.of(job).model_dump(),
        children=[JobRef.of(c) for c in children[:MAX_LISTED]],
        depends_on=await _visible_ids(caller, upstream),
        dependents=await _visible_ids(caller, downstream),
        unserved=await caller.app.jobs.unserved_reason(job),
    )


@router.get("/jobs/{job_id}/events", response_model=EventList, summary="A job's history")
async def job_events(job_id: JobIdPath, caller: Reader) -> EventList:
    async with caller.attempt(_target(job_id), mutation=False):
        await caller.job(job_id)
    return EventList(items=[EventOut.of(e) for e in await caller.app.jobs.events(job_id)])


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=CancellationOut,
    summary="Cancel a job",
    description="A job that is not running is cancelled at once; a running one is asked to "
    "stop, and the call waits up to `wait` seconds (capped by the server) for it.",
)
async def cancel_job(
    job_id: JobIdPath,
    caller: Annotated[Caller, Depends(require("job.cancel", WRITERS))],
    body: Annotated[CancelIn | None, Body()] = None,
) -> CancellationOut:
    body = body or CancelIn()
    async with caller.attempt(_target(job_id), mutation=True) as att:
        await caller.job(job_id)
        att.detail = body.reason
        result = await caller.app.cancel(
            job_id,
            reason=body.reason,
            force=body.force,
            cascade=body.cascade,
            wait=min(body.wait, caller.api.settings.max_wait),
            actor=caller.principal.name,
            # Scoped to the principal: one client's ids can never meet another's.
            request_id=f"{caller.principal.name}:{body.request_id}" if body.request_id else None,
        )
    return await for_member(caller, CancellationOut.of(result), CANCEL_FIELDS)


@router.get(
    "/jobs/{job_id}/cancellation-status",
    response_model=CancellationStatus,
    summary="Where a job's cancellation stands",
    description="With `wait`, answers once the cancellation has settled and the job has "
    "stopped, or when the wait ends (event-driven; capped by the server, and at least its "
    "poll floor).",
)
async def cancellation_status(
    job_id: JobIdPath,
    caller: Reader,
    wait: Annotated[float, Query(ge=0, le=3600, description="Seconds to wait.")] = 0.0,
) -> CancellationStatus:
    async with caller.attempt(_target(job_id), mutation=False):
        await caller.job(job_id)
    settings = caller.api.settings
    record = await caller.app.cancellations.get(job_id)
    job = await caller.app.get(job_id)
    if record is not None and wait > 0 and not _done(record.settled, job):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(wait, settings.min_poll_interval), settings.max_wait)
        # Waits for the job to stop too, and completes a record that settled while it ran.
        await caller.app.cancellations.wait(job_id, deadline - loop.time())
        record = await caller.app.cancellations.get(job_id)
        job = await caller.app.get(job_id)
    errors = record.errors if record is not None else []
    status = CancellationStatus(
        job_id=job.id,
        state=job.state,
        display_state=job.display_state,
        settled=record is not None and record.settled,
        stopped=job.state is not JobState.RUNNING,
        success=(record.status == "completed") if record is not None and record.settled else None,
        errors=errors,
        cancellation=(
            await for_member(caller, CancellationRecordOut.of(record), RECORD_FIELDS)
            if record is not None
            else None
        ),
    )
    return await for_member(caller, status, ("errors",))


def _done(settled: bool, job: Job) -> bool:
    return settled and job.state is not JobState.RUNNING


@router.get(
    "/jobs/{job_id}/steps",
    response_model=DurableStepList,
    summary="A job's durable steps, and what it waits for",
)
async def job_steps(job_id: JobIdPath, caller: Reader) -> DurableStepList:
    async with caller.attempt(_target(job_id), mutation=False):
        job = await caller.job(job_id)
    steps = await caller.app.durable.steps(job_id)
    return DurableStepList(
        items=[DurableStepOut.of(s) for s in steps],
        waiting_for=display.waiting_for(job, steps, datetime.now(UTC)),
    )


@router.get(
    "/jobs/{job_id}/logs",
    response_model=JobLogList,
    summary="A job's own log (ctx.log)",
    description="The lines the job's handler logged with a `seq` above `after`, oldest "
    "first; poll with `after=next_after` to follow a running job (its lines are written "
    "within a fraction of a second, and all of them before its outcome: once `finished` "
    "is true, nothing follows). Lines that name jobs the caller may not see are redacted.",
)
async def job_logs(
    job_id: JobIdPath,
    caller: Reader,
    after: Annotated[int, Query(ge=0, le=10**9, description="Lines after this seq.")] = 0,
    limit: Limit = MAX_PAGE_SIZE,
) -> JobLogList:
    async with caller.attempt(_target(job_id), mutation=False):
        job = await caller.job(job_id)
    lines = await caller.app.jobs.logs(job_id, after=after, limit=limit)
    page = JobLogList(
        items=[JobLogLineOut.of(x) for x in lines],
        next_after=lines[-1].seq if lines else after,
        # The state read before the lines: a finished job's lines were all in by then.
        finished=job.state in TERMINAL,
    )
    return await for_member(caller, page, ("items",))


@router.post(
    "/jobs/{job_id}/signals/{name}",
    response_model=SignalOut,
    summary="Send a signal to a job",
    description="For `ctx.wait_for(name)`: a job parked in that wait runs again at once; a "
    "signal sent before the wait is kept until the job reaches it. The same signal sent "
    "again is a `duplicate`; another payload under the same name is refused (409), as is "
    "a signal to a finished job or past its wait's timeout.",
)
async def signal_job(
    job_id: JobIdPath,
    name: Annotated[str, Path(min_length=1, max_length=200, pattern=NAME)],
    caller: Annotated[Caller, Depends(require("job.signal", WRITERS))],
    body: Annotated[SignalIn | None, Body()] = None,
) -> SignalOut:
    async with caller.attempt(_target(job_id), mutation=True):
        await caller.job(job_id)
        answer = await caller.app.durable.signal(
            job_id, name, body.payload if body else None, actor=caller.principal.name
        )
    return SignalOut(job_id=job_id, signal=name, answer=answer)  # type: ignore[arg-type]


@router.post("/jobs/{job_id}/pause", response_model=JobOut, summary="Pause a job")
async def pause_job(
    job_id: JobIdPath,
    caller: Annotated[Caller, Depends(require("job.pause", WRITERS))],
    body: Annotated[PauseIn | None, Body()] = None,
) -> JobOut:
    async with caller.attempt(_target(job_id), mutation=True):
        await caller.job(job_id)
        job = await caller.app.jobs.pause(
            job_id, reason=body.reason if body else None, actor=caller.principal.name
        )
    return JobOut.of(job)


@router.post("/jobs/{job_id}/resume", response_model=JobOut, summary="Resume a paused job")
async def resume_job(
    job_id: JobIdPath,
    caller: Annotated[Caller, Depends(require("job.resume", WRITERS))],
    body: Annotated[ResumeIn | None, Body()] = None,
) -> JobOut:
    async with caller.attempt(_target(job_id), mutation=True):
        await caller.job(job_id)
        job = await caller.app.jobs.resume(
            job_id, budget=body.budget if body else None, actor=caller.principal.name
        )
    return JobOut.of(job)


@router.post("/jobs/{job_id}/retry", response_model=JobOut, summary="Retry a failed job")
async def retry_job(
    job_id: JobIdPath,
    caller: Annotated[Caller, Depends(require("job.retry", WRITERS))],
) -> JobOut:
    async with caller.attempt(_target(job_id), mutation=True):
        await caller.job(job_id)
        job = await caller.app.jobs.retry(job_id, actor=caller.principal.name)
    return JobOut.of(job)


@router.delete(
    "/jobs/{job_id}",
    response_model=Deleted,
    summary="Delete a job",
    description="Its active children are cancelled first; children that ended are kept.",
)
async def delete_job(
    job_id: JobIdPath,
    caller: Annotated[Caller, Depends(require("job.delete", WRITERS))],
) -> Deleted:
    async with caller.attempt(_target(job_id), mutation=True):
        await caller.job(job_id)
        children = await caller.app.jobs.delete(job_id, actor=caller.principal.name)
    return Deleted(deleted=job_id, children_cancelled=[c.id for c in children])
