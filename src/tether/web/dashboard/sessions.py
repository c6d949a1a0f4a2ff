"""Who is at the dashboard: server-side sessions, the logged-in visitor of each request,
and the CSRF and target checks of every POST (the dependencies of every route)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Path, Request

from tether import names
from tether.auth import Principal, Role
from tether.web.models import MAX_ID
from tether.web.security import WRITERS, Api, Caller, authorize

COOKIE = "tether_session"
LOGIN_COOKIE = "tether_login"
SESSION_TTL = 12 * 3600.0
MAX_SESSIONS = 1000


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
