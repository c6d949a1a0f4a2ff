"""The pages: the overview, jobs, one job, queues, workers, schedules, cancellations and
the demo, and the API's event stream for a logged-in browser."""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from tether import strictint
from tether.errors import JobNotFoundError
from tether.job import Job
from tether.states import JobState
from tether.web.dashboard.rendering import _now, _totals_hidden, fragment, render
from tether.web.dashboard.sessions import Page, Visitor
from tether.web.errors import ApiError
from tether.web.models import MAX_ID, Stats
from tether.web.routes import control, jobs, schedules, stream
from tether.web.security import ALL_ROLES, Caller

router = APIRouter(include_in_schema=False)
LISTED = 200


async def _rescued(caller: Caller, recent: list[Job]) -> int:
    """Zombies the rescuer took back, among recent jobs that ran more than once."""
    n = 0
    for job in [j for j in recent if j.attempt > 1][:100]:
        with contextlib.suppress(JobNotFoundError):
            n += sum(1 for e in await caller.app.jobs.events(job.id) if e.actor == "rescuer")
    return n


def _throughput(done: list[Job], minutes: int = 15) -> dict[str, Any]:
    """Jobs finished per minute over the last ``minutes``, and their mean run time, with
    the SVG geometry of a small bar chart."""
    now = _now()
    buckets = [0] * minutes
    runs: list[list[float]] = [[] for _ in range(minutes)]
    for job in done:
        if job.finished_at is None:
            continue
        ago = int((now - job.finished_at).total_seconds() // 60)
        if 0 <= ago < minutes:
            buckets[minutes - 1 - ago] += 1
            if job.started_at is not None:
                runs[minutes - 1 - ago].append((job.finished_at - job.started_at).total_seconds())
    top = max(buckets) or 1
    width, height, gap = 300, 60, 2
    bar = width / minutes
    bars = [
        {
            "x": round(i * bar + gap / 2, 1),
            "w": round(bar - gap, 1),
            "h": round(height * n / top, 1),
            "y": round(height - height * n / top, 1),
            "n": n,
            "mean": (sum(runs[i]) / len(runs[i])) if runs[i] else None,
            "ago": minutes - 1 - i,
        }
        for i, n in enumerate(buckets)
    ]
    all_runs = [r for rs in runs for r in rs]
    return {
        "bars": bars,
        "width": width,
        "height": height,
        "total": sum(buckets),
        "per_minute": sum(buckets) / minutes,
        "mean_seconds": sum(all_runs) / len(all_runs) if all_runs else None,
        "top": top,
        "minutes": minutes,
    }


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request, v: Page) -> HTMLResponse:
    caller = await v.caller("stats.read", ALL_ROLES)
    owner = v.principal.owner_filter
    done = await caller.app.jobs.list(state=["succeeded", "failed"], owner=owner, limit=1000)
    recent = await caller.app.jobs.list(owner=owner, limit=500)
    workers = (await control.list_workers(await v.caller("worker.list", ALL_ROLES))).items
    if _totals_hidden(v):
        # Only the member's own (recent) jobs; no other principal's keys.
        counts = {s.value: sum(1 for j in recent if j.state is s) for s in JobState}
        stats, keys = Stats(states=counts, total=sum(counts.values())), []
    else:
        stats = await control.stats(caller)
        keys = (await control.list_keys(await v.caller("key.list", ALL_ROLES))).items
    page = "overview_live.html" if fragment(request) else "overview.html"
    return render(
        v,
        page,
        nav="overview",
        stats=stats,
        chart=_throughput(done),
        workers=workers,
        blocked=[k for k in keys if k.blocked_reason],
        rescued=await _rescued(caller, recent),
        cancelling=[j for j in recent if j.display_state in ("cancelling", "pausing")],
    )


def _matches(job: Job, q: str) -> bool:
    q = q.lower()
    text = " ".join(
        [
            str(job.id),
            job.task,
            job.queue,
            job.key or "",
            job.owner or "",
            job.error or "",
            json.dumps(job.args, default=str),
        ]
    ).lower()
    return q in text


@router.get("/jobs", response_class=HTMLResponse)
async def jobs_page(
    request: Request,
    v: Page,
    state: Annotated[str, Query(max_length=40)] = "",
    queue: Annotated[str, Query(max_length=200)] = "",
    task: Annotated[str, Query(max_length=200)] = "",
    q: Annotated[str, Query(max_length=200)] = "",
) -> HTMLResponse:
    caller = await v.caller("job.list", ALL_ROLES)
    display_states = ("cancelling", "pausing")
    real = state if state in {s.value for s in JobState} else None
    if state in display_states:
        real = "running"
    found = await caller.app.jobs.list(
        state=real,
        queue=queue or None,
        task=task or None,
        owner=v.principal.owner_filter,
        limit=1000 if q or state in display_states else LISTED,
    )
    if state in display_states:
        found = [j for j in found if j.display_state == state]
    if q:
        found = [j for j in found if _matches(j, q)]
    filters = {"state": state, "queue": queue, "task": task, "q": q}
    return render(
        v,
        "jobs_live.html" if fragment(request) else "jobs.html",
        nav="jobs",
        jobs=found[:LISTED],
        filters=filters,
        query=urlencode({k: val for k, val in filters.items() if val}),
        states=[s.value for s in JobState] + list(display_states),
        queues=await _queue_choices(v, caller, found),
        tasks=sorted(caller.app.tasks),
    )


async def _queue_choices(v: Visitor, caller: Caller, shown: list[Job]) -> list[str]:
    """The queue filter's choices: every queue, or, for a member of a server that hides
    the totals, only the queues of the member's own jobs (other owners' queue names are
    part of what it hides)."""
    if _totals_hidden(v):
        return sorted({j.queue for j in shown})
    return [qi.name for qi in await caller.app.queues.list()]


#: The lines of a job's own log its page shows (re-read at each refresh); the CLI and
#: the API page through all of them.
LOG_LINES_SHOWN = 500


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(request: Request, job_id: str, v: Page) -> HTMLResponse:
    # Missing, hidden (another principal's) and malformed ids get one and the same page.
    number = strictint.parse(job_id, 1, MAX_ID)
    caller = await v.caller("job.read", ALL_ROLES)
    try:
        if number is None:
            raise JobNotFoundError(0)
        detail = await jobs.get_job(number, caller)
        job = await caller.app.get(number)
        events = await caller.app.jobs.events(number)
        artifacts = await caller.app.jobs.artifacts(number)
        steps = await jobs.job_steps(number, caller)
        logs = await jobs.job_logs(number, caller, after=0, limit=LOG_LINES_SHOWN)
        status = await jobs.cancellation_status(number, caller, 0.0)
        record = status.cancellation
    except (ApiError, JobNotFoundError):
        return _no_job(v, job_id)
    grandchildren: dict[int, list[Job]] = {}
    for child in detail.children[:50]:
        grandchildren[child.id] = [
            c for c in await caller.app.jobs.children(child.id) if v.principal.sees(c)
        ][:50]
    heartbeat_age = (
        (_now() - job.heartbeat_at).total_seconds() if job.heartbeat_at is not None else None
    )
    return render(
        v,
        "job_live.html" if fragment(request) else "job.html",
        nav="jobs",
        job=job,
        detail=detail,
        events=events,
        artifacts=artifacts,
        steps=steps,
        logs=logs,
        log_lines_shown=LOG_LINES_SHOWN,
        record=record,
        grandchildren=grandchildren,
        heartbeat_age=heartbeat_age,
    )


def _no_job(v: Visitor, job_id: str) -> HTMLResponse:
    return render(v, "error.html", 404, nav="jobs", message=f"job {job_id[:40]} does not exist")


@router.get("/queues", response_class=HTMLResponse)
async def queues_page(request: Request, v: Page) -> HTMLResponse:
    hidden = _totals_hidden(v)
    queues = (
        [] if hidden else (await control.list_queues(await v.caller("queue.list", ALL_ROLES))).items
    )
    keys = [] if hidden else (await control.list_keys(await v.caller("key.list", ALL_ROLES))).items
    caller = await v.caller("job.list", ALL_ROLES)
    holders: dict[str, list[Job]] = {}
    for k in keys:
        if k.kind == "key" and k.blocked_reason:
            name = k.name
            holders[k.name] = [
                j
                for j in await caller.app.jobs.list(
                    key=name,
                    state=["paused", "failed", "running"],
                    owner=v.principal.owner_filter,
                    limit=20,
                )
            ]
    return render(
        v,
        "queues_live.html" if fragment(request) else "queues.html",
        nav="queues",
        queues=queues,
        keys=keys,
        holders=holders,
    )


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(request: Request, v: Page) -> HTMLResponse:
    listed = await control.list_workers(await v.caller("worker.list", ALL_ROLES))
    return render(
        v,
        "workers_live.html" if fragment(request) else "workers.html",
        nav="workers",
        workers=listed.items,
        leader=listed.leader,
    )


@router.get("/schedules", response_class=HTMLResponse)
async def schedules_page(request: Request, v: Page) -> HTMLResponse:
    caller = await v.caller("schedule.list", ALL_ROLES)
    return render(
        v,
        "schedules_live.html" if fragment(request) else "schedules.html",
        nav="schedules",
        schedules=(await schedules.list_schedules(caller)).items,
    )


@router.get("/cancellations", response_class=HTMLResponse)
async def cancellations_page(request: Request, v: Page) -> HTMLResponse:
    caller = await v.caller("cancellation.list", ALL_ROLES)
    page = await control.list_cancellations(caller, limit=50, offset=0)
    return render(
        v,
        "cancellations_live.html" if fragment(request) else "cancellations.html",
        nav="cancellations",
        records=page.items,
    )


@router.get("/demo", response_class=HTMLResponse)
async def demo_page(v: Page) -> HTMLResponse:
    return render(v, "demo.html", nav="demo")


@router.get("/ui/events")
async def ui_events(request: Request, v: Page) -> Response:
    """The API's event stream for a logged-in browser (an EventSource cannot send a
    bearer token): same filters for members, same code."""
    caller = await v.caller("events.read", ALL_ROLES)
    return await stream.events(
        request,
        caller,
        job=strictint.parse(request.query_params.get("job"), 1, MAX_ID),
        since=None,
        timeout=600.0,
        queue=None,
        state=None,
        poll=0.5,
        limit=None,
        last_event_id=request.headers.get("last-event-id"),
    )
