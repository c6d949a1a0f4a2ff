"""The dashboard: server-rendered pages at ``/`` over the same authorization and audit as
the REST API.

- **Login.** A form posts an API token. The server checks it, keeps it in a server-side
  session (in memory, never in a page) and sets an opaque session id as an HttpOnly,
  SameSite=Strict cookie. Every request authenticates the token again, so a revoked
  token ends its sessions at once.
- **CSRF.** Each session has a random CSRF token, rendered into every form; a POST
  without the matching token is refused (403) before anything else happens.
- **Targets.** Every URL is built from path segments encoded one by one, and every form
  names the path it posts to: a POST that arrives anywhere else (a browser rewrote the
  URL) is refused, so no name can turn one button into another.
- **CSP.** Every page is sent with a Content-Security-Policy that allows only 'self'
  (no inline script or style), and all job data is escaped by Jinja2's autoescape.
- **Actions** call the API's route functions with a :class:`Caller` made by
  :func:`~tether.web.security.authorize`: same roles, same audit rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path as FilePath
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import jinja2
from fastapi import APIRouter, Depends, Form, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from tether import names, strictint
from tether.auth import Principal, Role
from tether.errors import JobNotFoundError, TetherError
from tether.job import Job
from tether.states import JobState
from tether.web.errors import ApiError, classify
from tether.web.models import MAX_ID, CancelIn, PauseIn, QueuePauseIn, Stats
from tether.web.routes import control, jobs, schedules, stream
from tether.web.security import ADMINS, ALL_ROLES, WRITERS, Api, Caller, authorize, limit

log = logging.getLogger("tether.web")
HERE = FilePath(__file__).parent
COOKIE = "tether_session"
LOGIN_COOKIE = "tether_login"
SESSION_TTL = 12 * 3600.0
MAX_SESSIONS = 1000
CANCEL_WAIT = 30.0
"""How long a cancel from the dashboard follows a running job (the server caps it too)."""
ANSWER_WITHIN = 1.0
"""How long a cancel waits before the page answers (the job shows "cancelling")."""
BULK_CANCEL_MAX = 50
"""The most jobs one bulk cancel may name."""
LISTED = 200
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


@dataclass
class Session:
    """One logged-in browser: the token it logged in with stays on the server."""

    token: str
    csrf: str
    expires: float
    flash: list[tuple[str, str]] = field(default_factory=list)


class Sessions:
    """Server-side sessions, keyed by a random id (the cookie's value)."""

    def __init__(self) -> None:
        self._by_id: dict[str, Session] = {}

    def create(self, token: str) -> tuple[str, Session]:
        """A new session for ``token``."""
        now = time.monotonic()
        self._by_id = {k: s for k, s in self._by_id.items() if s.expires > now}
        while len(self._by_id) >= MAX_SESSIONS:
            self._by_id.pop(next(iter(self._by_id)))
        sid = secrets.token_urlsafe(32)
        session = Session(token, secrets.token_urlsafe(32), now + SESSION_TTL)
        self._by_id[sid] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The live session with this id."""
        if not sid:
            return None
        session = self._by_id.get(sid)
        if session is None or session.expires <= time.monotonic():
            self._by_id.pop(sid, None)
            return None
        return session

    def drop(self, sid: str | None) -> None:
        """Log a session out."""
        if sid:
            self._by_id.pop(sid, None)


@dataclass
class Visitor:
    """A request from a logged-in browser."""

    request: Request
    api: Api
    session: Session
    principal: Principal

    @property
    def can_write(self) -> bool:
        """Whether to show action buttons (the server checks again on every POST)."""
        return self.principal.role in WRITERS

    @property
    def is_admin(self) -> bool:
        """Whether queue actions are shown."""
        return self.principal.role is Role.ADMIN

    async def caller(self, action: str, roles: tuple[Role, ...]) -> Caller:
        """Authorize ``action`` exactly as the API does (403 and an audit row if not)."""
        rid: str | None = getattr(self.request.state, "request_id", None)
        return await authorize(self.api, self.principal, action, roles, rid, self.request.url.path)

    def flash(self, kind: str, text: str) -> None:
        """A message for the next page."""
        self.session.flash.append((kind, text))


class LoginRequired(Exception):
    """No valid session: go to the login page."""


class CsrfRefused(Exception):
    """A POST without the session's CSRF token, or sent to a path its form does not name."""

    def __init__(self, why: str = "this form has no valid CSRF token (reload the page)") -> None:
        super().__init__(why)
        self.why = why


def _raw_path(request: Request) -> str:
    raw = request.scope.get("raw_path")
    return raw.decode("latin-1") if isinstance(raw, bytes) else request.url.path


def _sessions(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.dashboard_sessions
    return sessions


async def visitor(request: Request) -> Visitor:
    """The dependency of every page: the session's principal, or a redirect to login."""
    api: Api = request.app.state.api
    session = _sessions(request).get(request.cookies.get(COOKIE))
    if session is None:
        raise LoginRequired
    principal = await api.tokens.authenticate(session.token)
    if principal is None:  # revoked since login
        _sessions(request).drop(request.cookies.get(COOKIE))
        raise LoginRequired
    return Visitor(request, api, session, principal)


async def writer(request: Request, v: Annotated[Visitor, Depends(visitor)]) -> Visitor:
    """The dependency of every POST: a session, its CSRF token, and the path the form
    names as its target."""
    form = await request.form()
    given = form.get("csrf")
    target = form.get("target")
    why, refusal = None, CsrfRefused()
    if not isinstance(given, str) or not secrets.compare_digest(given, v.session.csrf):
        why = "missing or bad CSRF token"
    elif not isinstance(target, str) or target != _raw_path(request):
        # The form was built for another path (a name a browser resolved as "..", say).
        why = f"the form names {str(target)[:200]!r} as its target"
        refusal = CsrfRefused("this form was sent to another page than the one it names")
    if why is not None:
        await v.api.record(
            v.principal.name,
            "dashboard.post",
            request.url.path,
            "denied",
            getattr(request.state, "request_id", None),
            why,
        )
        raise refusal
    return v


Page = Annotated[Visitor, Depends(visitor)]
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
QueueName = Annotated[str, Path(pattern=names.NAME_PATTERN)]
Post = Annotated[Visitor, Depends(writer)]
router = APIRouter(include_in_schema=False)


# -- rendering -----------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def _age(at: datetime | None) -> str:
    if at is None:
        return ""
    secs = (_now() - at).total_seconds()
    if secs < 0:
        return f"in {_span(-secs)}"
    return f"{_span(secs)} ago"


def _span(secs: float) -> str:
    if secs < 60:
        return f"{secs:.1f}s"
    if secs < 3600:
        return f"{secs / 60:.0f}m"
    if secs < 86400:
        return f"{secs / 3600:.1f}h"
    return f"{secs / 86400:.1f}d"


def _when(at: datetime | str | None) -> str:
    if at is None:
        return ""
    if isinstance(at, str):
        return at.replace("T", " ")[:23]
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


templates.filters["age"] = _age
templates.filters["when"] = _when
templates.filters["pretty"] = _pretty
# One URL path segment: "/" and every other reserved character percent-encoded (Jinja's
# urlencode leaves "/" as it is).
templates.filters["seg"] = lambda v: quote(str(v), safe="")
templates.filters["compact"] = lambda v: json.dumps(v, sort_keys=True, default=str)[:160]


def render(v: Visitor | None, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A page (or, with ``?fragment=1``, only its live part), with the security headers."""
    flashes: list[tuple[str, str]] = []
    # A live region's refresh (a fragment) shows no flashes, so it must not take them:
    # one arriving between an action and its redirect would swallow the message.
    if v is not None and not name.endswith("_live.html"):
        flashes, v.session.flash = v.session.flash, []
    html = templates.get_template(name).render(
        v=v,
        me=v.principal if v else None,
        csrf=v.session.csrf if v else "",
        flashes=flashes,
        bulk_max=BULK_CANCEL_MAX,
        totals_hidden=v is not None and _totals_hidden(v),
        **context,
    )
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _totals_hidden(v: Visitor) -> bool:
    return v.principal.owner_filter is not None and not v.api.settings.members_see_totals


def fragment(request: Request) -> bool:
    """Whether the page asked for only its live region (the live-update script does)."""
    return request.query_params.get("fragment") == "1"


def redirect(url: str) -> RedirectResponse:
    """A 303 back to a page after a POST."""
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


async def act(v: Visitor, ok: str, fn: Any) -> None:
    """Run an action; tell the person how it went on the next page."""
    try:
        await fn
    except (ApiError, TetherError) as exc:
        _, code, message = classify(exc)
        v.flash("error", f"{code}: {message}")
    else:
        v.flash("ok", ok)


# -- login ---------------------------------------------------------------------------------


@router.get("/login")
async def login_page(request: Request) -> HTMLResponse:
    # The login form has a CSRF token too (double submit: a cookie and a form field must
    # match), so another site cannot log a browser in under its own token.
    nonce = secrets.token_urlsafe(32)
    res = render(None, "login.html", error=request.query_params.get("error") == "1", nonce=nonce)
    res.set_cookie(
        LOGIN_COOKIE,
        nonce,
        max_age=3600,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/login",
    )
    return res


@router.post("/login")
async def login(
    request: Request,
    token: Annotated[str, Form(max_length=300)] = "",
    csrf: Annotated[str, Form(max_length=100)] = "",
) -> Response:
    api: Api = request.app.state.api
    expected = request.cookies.get(LOGIN_COOKIE, "")
    rid = getattr(request.state, "request_id", None)
    address = f"addr:{request.client.host if request.client else '?'}"
    if not expected or not secrets.compare_digest(csrf, expected):
        # Audited like a failed login (and limited the same way, so it cannot flood).
        await limit(api, address, "unauthenticated", "dashboard.login", "/login", rid)
        await api.record(
            "unauthenticated",
            "dashboard.login",
            "/login",
            "denied",
            rid,
            "missing or bad CSRF token",
        )
        raise CsrfRefused
    principal = await api.tokens.authenticate(token.strip())
    if principal is None:
        # Refusals are rate-limited per address, as the API's are (and audited once a minute).
        await limit(api, address, "unauthenticated", "dashboard.login", "/login", rid)
        await api.record(
            "unauthenticated",
            "dashboard.login",
            "/login",
            "denied",
            rid,
            "invalid or revoked token",
        )
        return redirect("/login?error=1")
    await api.record(principal.name, "dashboard.login", "/login", "ok", rid)
    sid, _ = _sessions(request).create(token.strip())
    res = redirect("/")
    res.delete_cookie(LOGIN_COOKIE, path="/login")
    res.set_cookie(
        COOKIE,
        sid,
        max_age=int(SESSION_TTL),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return res


@router.post("/logout")
async def logout(request: Request, v: Post) -> Response:
    _sessions(request).drop(request.cookies.get(COOKIE))
    rid = getattr(request.state, "request_id", None)
    await v.api.record(v.principal.name, "dashboard.logout", "/logout", "ok", rid)
    res = redirect("/login")
    res.delete_cookie(COOKIE, path="/")
    return res


# -- pages ---------------------------------------------------------------------------------


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


# -- actions -------------------------------------------------------------------------------


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


# -- wiring --------------------------------------------------------------------------------


PAGES = {
    *("", "jobs", "queues", "workers", "cancellations", "demo", "ui", "login", "logout"),
    "schedules",
}


def _is_page(request: Request) -> bool:
    return request.url.path.split("/")[1] in PAGES


def install(api: Any) -> None:
    """Mount the dashboard on the FastAPI app ``api``."""
    api.state.dashboard_sessions = Sessions()
    api.state.dashboard_tasks = set()
    api.include_router(router)
    api.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    previous = api.exception_handlers.get(ApiError)

    async def login_required(request: Request, exc: Exception) -> Response:
        return redirect("/login")

    async def csrf_refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, CsrfRefused)
        return HTMLResponse(
            templates.get_template("error.html").render(
                v=None,
                me=None,
                csrf="",
                flashes=[],
                bulk_max=BULK_CANCEL_MAX,
                nav="",
                message=f"refused: {exc.why}",
            ),
            status_code=403,
            headers=SECURITY_HEADERS,
        )

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        if _is_page(request) and previous is not None:
            # A refused dashboard action (a viewer's POST): a page, not JSON.
            return HTMLResponse(
                templates.get_template("error.html").render(
                    v=None,
                    me=None,
                    csrf="",
                    flashes=[],
                    bulk_max=BULK_CANCEL_MAX,
                    nav="",
                    message=f"{exc.code}: {exc.message}",
                ),
                status_code=exc.status,
                headers=SECURITY_HEADERS,
            )
        assert previous is not None
        result: Response = await previous(request, exc)
        return result

    api.add_exception_handler(LoginRequired, login_required)
    api.add_exception_handler(CsrfRefused, csrf_refused)
    api.add_exception_handler(ApiError, api_error)
