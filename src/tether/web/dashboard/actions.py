"""The buttons: each POST calls the API's route function with a caller authorized as the
API authorizes it (same roles, same audit rows), then goes back to a page with a message."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from tether import strictint
from tether.errors import TetherError
from tether.web.dashboard.rendering import BULK_CANCEL_MAX, redirect, render
from tether.web.dashboard.sessions import JobId, Post, QueueName, Visitor
from tether.web.errors import ApiError, classify
from tether.web.models import MAX_ID, CancelIn, PauseIn, QueuePauseIn, SignalIn
from tether.web.routes import control, jobs, schedules
from tether.web.security import ADMINS, WRITERS, Caller

log = logging.getLogger("tether.web")
router = APIRouter(include_in_schema=False)
CANCEL_WAIT = 30.0
"""How long a cancel from the dashboard follows a running job (the server caps it too)."""
ANSWER_WITHIN = 1.0
"""How long a cancel waits before the page answers (the job shows "cancelling")."""


async def act(v: Visitor, ok: str, fn: Any) -> None:
    """Run an action; tell the person how it went on the next page."""
    try:
        await fn
    except (ApiError, TetherError) as exc:
        _, code, message = classify(exc)
        v.flash("error", f"{code}: {message}")
    else:
        v.flash("ok", ok)


def _back(job_id: int) -> str:
    return f"/jobs/{job_id}"


async def _cancel(
    v: Visitor, caller: Caller, job_id: int, body: CancelIn, answer_within: float = ANSWER_WITHIN
) -> None:
    """The API's cancel. The page answers once it is done or after ``answer_within``
    seconds; a running job's cancellation goes on in the background until the job stops,
    so its record completes (and is audited) as the API's would."""
    task = asyncio.create_task(jobs.cancel_job(job_id, caller, body), name=f"cancel-{job_id}")
    pending: set[asyncio.Task[Any]] = v.request.app.state.dashboard_tasks
    pending.add(task)
    task.add_done_callback(lambda t: _settled(pending, t))
    done, _ = await asyncio.wait({task}, timeout=answer_within)
    if task in done:
        task.result()


def _settled(pending: set[asyncio.Task[Any]], task: asyncio.Task[Any]) -> None:
    pending.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s: %s", task.get_name(), task.exception())


@router.post("/jobs/{job_id}/cancel")
async def cancel(
    job_id: JobId,
    v: Post,
    reason: Annotated[str, Form(max_length=500)] = "",
    force: Annotated[str, Form()] = "",
    cascade: Annotated[str, Form()] = "",
) -> Response:
    caller = await v.caller("job.cancel", WRITERS)
    body = CancelIn(
        reason=reason or "cancelled from the dashboard",
        force=bool(force),
        cascade=bool(cascade),
        wait=CANCEL_WAIT,
    )
    await act(v, f"cancel of job {job_id} requested", _cancel(v, caller, job_id, body))
    return redirect(_back(job_id))


@router.post("/jobs/{job_id}/pause")
async def pause(
    job_id: JobId, v: Post, reason: Annotated[str, Form(max_length=500)] = ""
) -> Response:
    caller = await v.caller("job.pause", WRITERS)
    body = PauseIn(reason=reason or "paused from the dashboard")
    await act(v, f"pause of job {job_id} requested", jobs.pause_job(job_id, caller, body))
    return redirect(_back(job_id))


@router.post("/jobs/{job_id}/resume")
async def resume(job_id: JobId, v: Post) -> Response:
    caller = await v.caller("job.resume", WRITERS)
    await act(v, f"job {job_id} resumed", jobs.resume_job(job_id, caller, None))
    return redirect(_back(job_id))


@router.post("/jobs/{job_id}/retry")
async def retry(job_id: JobId, v: Post) -> Response:
    caller = await v.caller("job.retry", WRITERS)
    await act(v, f"job {job_id} queued again", jobs.retry_job(job_id, caller))
    return redirect(_back(job_id))


@router.post("/jobs/{job_id}/signal")
async def signal(
    job_id: JobId,
    v: Post,
    name: Annotated[str, Form(min_length=1, max_length=200)],
    decision: Annotated[str, Form(pattern="^(approve|reject)$")],
) -> Response:
    caller = await v.caller("job.signal", WRITERS)
    approved = decision == "approve"
    body = SignalIn(payload={"approved": approved, "by": caller.principal.name})
    done = "approved" if approved else "rejected"
    await act(v, f"job {job_id}: {name} {done}", jobs.signal_job(job_id, name, caller, body))
    return redirect(_back(job_id))


@router.post("/jobs/{job_id}/delete")
async def delete(job_id: JobId, v: Post, confirm: Annotated[str, Form()] = "") -> Response:
    caller = await v.caller("job.delete", WRITERS)
    if confirm != "yes":
        v.flash("error", "tick the confirmation box to delete a job")
        return redirect(_back(job_id))
    await act(v, f"job {job_id} deleted", jobs.delete_job(job_id, caller))
    return redirect("/jobs")


@router.post("/jobs/bulk-cancel")
async def bulk_cancel(request: Request, v: Post) -> Response:
    """Step one lists what would be cancelled and asks; step two (``confirm=yes``)
    cancels each job through the API's cancel, at most ``BULK_CANCEL_MAX``."""
    caller = await v.caller("job.cancel", WRITERS)
    form = await request.form()
    parsed = (strictint.parse(x, 1, MAX_ID) for x in form.getlist("ids") if isinstance(x, str))
    ids = sorted({i for i in parsed if i is not None})
    if not ids:
        v.flash("error", "select at least one job")
        return redirect("/jobs")
    if len(ids) > BULK_CANCEL_MAX:
        v.flash(
            "error", f"a bulk cancel may name at most {BULK_CANCEL_MAX} jobs ({len(ids)} given)"
        )
        return redirect("/jobs")
    reason = str(form.get("reason") or "bulk cancel from the dashboard")[:500]
    if form.get("confirm") != "yes":
        return render(v, "bulk_confirm.html", nav="jobs", ids=ids, reason=reason)
    done, failed = 0, []
    for job_id in ids:
        try:
            body = CancelIn(reason=reason, wait=CANCEL_WAIT)
            await _cancel(v, caller, job_id, body, answer_within=0.2)
            done += 1
        except (ApiError, TetherError) as exc:
            failed.append(f"{job_id} ({classify(exc)[1]})")
    v.flash("ok", f"cancel requested for {done} job(s)")
    if failed:
        v.flash("error", "not cancelled: " + ", ".join(failed))
    return redirect("/jobs")


@router.post("/queues/{name}/pause")
async def queue_pause(
    name: QueueName, v: Post, reason: Annotated[str, Form(max_length=500)] = ""
) -> Response:
    caller = await v.caller("queue.pause", ADMINS)
    body = QueuePauseIn(reason=reason or None)
    await act(v, f"queue {name} paused", control.pause_queue(name, caller, body))
    return redirect("/queues")


@router.post("/queues/{name}/resume")
async def queue_resume(name: QueueName, v: Post) -> Response:
    caller = await v.caller("queue.resume", ADMINS)
    await act(v, f"queue {name} resumed", control.resume_queue(name, caller))
    return redirect("/queues")


@router.post("/schedules/{name}/pause")
async def schedule_pause(name: QueueName, v: Post) -> Response:
    caller = await v.caller("schedule.pause", ADMINS)
    await act(v, f"schedule {name} paused", schedules.pause_schedule(name, caller))
    return redirect("/schedules")


@router.post("/schedules/{name}/resume")
async def schedule_resume(name: QueueName, v: Post) -> Response:
    caller = await v.caller("schedule.resume", ADMINS)
    await act(v, f"schedule {name} resumed", schedules.resume_schedule(name, caller))
    return redirect("/schedules")
