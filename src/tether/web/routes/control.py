"""Queues, keys, workers, stats, cancellations and the audit log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query

from tether import names
from tether.web.body import JsonRoute
from tether.web.models import (
    AuditOut,
    AuditPage,
    Backlog,
    BacklogCounts,
    CancellationPage,
    CancellationRecordOut,
    KeyList,
    KeyOut,
    QueueBacklogOut,
    QueueList,
    QueueOut,
    QueuePauseIn,
    Stats,
    WorkerList,
    WorkerOut,
)
from tether.web.redact import for_member
from tether.web.routes import ERRORS
from tether.web.routes.jobs import RECORD_FIELDS, Limit, Offset
from tether.web.security import ADMINS, ALL_ROLES, Caller, require, totals_allowed

router = APIRouter(responses=ERRORS, route_class=JsonRoute)

QueueName = Annotated[str, Path(pattern=names.NAME_PATTERN, description="Queue.")]
RUNNING_SHOWN = 10_000  # running jobs listed across all workers (the running set is small)


def _next(offset: int, limit: int, found: int) -> int | None:
    return offset + limit if found == limit else None


@router.get(
    "/cancellations",
    response_model=CancellationPage,
    tags=["cancellations"],
    summary="Cancellation records, newest first",
)
async def list_cancellations(
    caller: Annotated[Caller, Depends(require("cancellation.list", ALL_ROLES))],
    limit: Limit = 20,
    offset: Offset = 0,
) -> CancellationPage:
    owner = caller.principal.owner_filter
    records = (
        await caller.app.cancellations.list(limit, offset)
        if owner is None
        else await caller.app.cancellations.owned_by(owner, limit, offset)
    )
    return CancellationPage(
        items=[
            await for_member(caller, CancellationRecordOut.of(r), RECORD_FIELDS) for r in records
        ],
        limit=limit,
        offset=offset,
        next_offset=_next(offset, limit, len(records)),
    )


@router.get("/queues", response_model=QueueList, tags=["queues"], summary="Queues")
async def list_queues(
    caller: Annotated[Caller, Depends(require("queue.list", ALL_ROLES))],
) -> QueueList:
    await totals_allowed(caller, "/api/queues")
    return QueueList(items=[QueueOut.of(q) for q in await caller.app.queues.list()])


@router.get(
    "/queues/backlog",
    response_model=Backlog,
    tags=["queues"],
    summary="Jobs waiting, due and running per queue, for autoscalers",
)
async def queue_backlog(
    caller: Annotated[Caller, Depends(require("queue.backlog", ALL_ROLES))],
    queue: Annotated[
        list[Annotated[str, Query(pattern=names.NAME_PATTERN)]] | None,
        Query(
            description="Only these queues (repeatable); each named is listed, with zeros "
            "if it has no jobs, and ``total`` sums them."
        ),
    ] = None,
) -> Backlog:
    await totals_allowed(caller, "/api/queues/backlog")
    found = {b.name: QueueBacklogOut.of(b) for b in await caller.app.queues.backlog()}
    if queue is not None:
        # A queue asked for is always there, so a scaler's valueLocation always resolves.
        zero = QueueBacklogOut(queued=0, due=0, running=0, demand=0, paused=False)
        found = {name: found.get(name, zero) for name in dict.fromkeys(queue)}
    total = BacklogCounts(
        queued=sum(b.queued for b in found.values()),
        due=sum(b.due for b in found.values()),
        running=sum(b.running for b in found.values()),
        demand=sum(b.demand for b in found.values()),
    )
    return Backlog(queues=found, total=total)


async def _queue(caller: Caller, name: str) -> QueueOut:
    for q in await caller.app.queues.list():
        if q.name == name:
            return QueueOut.of(q)
    # A resumed queue without jobs may not be listed: it is simply not paused.
    return QueueOut(name=name, paused=False, reason=None, counts={})


@router.post(
    "/queues/{name}/pause",
    response_model=QueueOut,
    tags=["queues"],
    summary="Stop claims from a queue (admin); running jobs finish",
)
async def pause_queue(
    name: QueueName,
    caller: Annotated[Caller, Depends(require("queue.pause", ADMINS))],
    body: Annotated[QueuePauseIn | None, Body()] = None,
) -> QueueOut:
    async with caller.attempt(f"queue:{name}", mutation=True) as att:
        att.detail = body.reason if body else None
        await caller.app.queues.pause(name, reason=body.reason if body else None)
    return await _queue(caller, name)


@router.post(
    "/queues/{name}/resume",
    response_model=QueueOut,
    tags=["queues"],
    summary="Let workers claim from a paused queue again (admin)",
)
async def resume_queue(
    name: QueueName,
    caller: Annotated[Caller, Depends(require("queue.resume", ADMINS))],
) -> QueueOut:
    async with caller.attempt(f"queue:{name}", mutation=True):
        await caller.app.queues.resume(name)
    return await _queue(caller, name)


@router.get(
    "/keys",
    response_model=KeyList,
    tags=["queues"],
    summary="Concurrency keys and resource pools, with what blocks them",
)
async def list_keys(
    caller: Annotated[Caller, Depends(require("key.list", ALL_ROLES))],
) -> KeyList:
    await totals_allowed(caller, "/api/keys")
    return KeyList(items=[KeyOut.of(lim) for lim in await caller.app.queues.limits()])


@router.get(
    "/workers",
    response_model=WorkerList,
    tags=["workers"],
    summary="Workers: state, last heartbeat and running jobs",
)
async def list_workers(
    caller: Annotated[Caller, Depends(require("worker.list", ALL_ROLES))],
    state: Annotated[
        list[str] | None,
        Query(description="Only workers in these states (active, draining, stopped, dead)."),
    ] = None,
) -> WorkerList:
    workers = [w for w in await caller.app.admin.workers() if not state or w.state in state]
    running = await caller.app.jobs.list(
        state="running", owner=caller.principal.owner_filter, limit=RUNNING_SHOWN
    )
    by_worker: dict[str, list[int]] = {}
    for job in running:
        if job.worker_id is not None:
            by_worker.setdefault(job.worker_id, []).append(job.id)
    leader = await caller.app.admin.leader()
    return WorkerList(
        items=[WorkerOut.of(w, sorted(by_worker.get(w.id, []))) for w in workers],
        leader=leader.holder if leader is not None and leader.active else None,
    )


@router.get("/stats", response_model=Stats, tags=["workers"], summary="Jobs in each state")
async def stats(caller: Annotated[Caller, Depends(require("stats.read", ALL_ROLES))]) -> Stats:
    await totals_allowed(caller, "/api/stats")
    counts = await caller.app.jobs.stats()
    return Stats(states=counts, total=sum(counts.values()))


@router.get(
    "/audit",
    response_model=AuditPage,
    tags=["audit"],
    summary="The audit log, newest first (admin)",
)
async def audit_log(
    caller: Annotated[Caller, Depends(require("audit.read", ADMINS))],
    limit: Limit = 50,
    offset: Offset = 0,
) -> AuditPage:
    rows = await caller.api.audit.list(limit, offset)
    return AuditPage(
        items=[AuditOut.of(e) for e in rows],
        limit=limit,
        offset=offset,
        next_offset=_next(offset, limit, len(rows)),
    )
