"""Who is calling, whether they may, and the audit row their attempt leaves.

Each route declares its action and the roles allowed with ``Depends(require(...))``.
The dependency runs before the route's parameters are validated, so an unauthenticated
request gets 401 whatever else is wrong with it.

Members see only the jobs they own. Another principal's job answers exactly like a job
that does not exist: the same 404, and the same work (both attempts are audited as
``denied``), so neither the answer nor its timing tells them apart.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tether.app import App
from tether.audit import Audit, by_caller
from tether.auth import ANONYMOUS, Principal, Role, Tokens
from tether.errors import JobNotFoundError, TetherError
from tether.job import Job
from tether.web.errors import ApiError, classify
from tether.web.ratelimit import RateLimiter
from tether.web.settings import ApiSettings

log = logging.getLogger("tether.web")

ALL_ROLES = (Role.ADMIN, Role.MEMBER, Role.VIEWER)
WRITERS = (Role.ADMIN, Role.MEMBER)
ADMINS = (Role.ADMIN,)

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="An API token from `tether token create` (sent as `Authorization: Bearer`).",
)


@dataclass
class Api:
    """What every request of one server shares."""

    app: App
    settings: ApiSettings
    tokens: Tokens
    audit: Audit
    limiter: RateLimiter
    warned_open: bool = field(default=False)
    # The minute each rate-limited client was last audited (one row per client and minute).
    refused: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, app: App, settings: ApiSettings) -> Api:
        """The shared state for ``app``."""
        return cls(
            app=app,
            settings=settings,
            tokens=Tokens(app),
            audit=Audit(app),
            limiter=RateLimiter(settings.rate_per_second, settings.rate_burst),
        )

    async def record(
        self,
        actor: str,
        action: str,
        target: str | None,
        result: str,
        request_id: str | None,
        detail: str | None = None,
    ) -> None:
        """Write an audit row; a failure to write it is logged, never raised, because
        the answer to the request (a refusal, or a change already made) stands."""
        try:
            await self.audit.record(
                actor, action, target, result, request_id=request_id, detail=detail
            )
        except Exception as exc:
            log.error("request %s: audit row not written (%s %s): %s", request_id, action,
                      result, exc)  # fmt: skip


@dataclass
class Caller:
    """An authenticated request: its principal, its action and its audit trail."""

    api: Api
    principal: Principal
    action: str
    request_id: str | None

    @property
    def app(self) -> App:
        """The tether App behind the API."""
        return self.api.app

    async def record(self, target: str | None, result: str, detail: str | None = None) -> None:
        """Audit this request's attempt on ``target``."""
        await self.api.record(
            self.principal.name, self.action, target, result, self.request_id, detail
        )

    async def job(self, job_id: int) -> Job:
        """The job, if this caller may see it; else the same 404 as a missing job.

        For a member, a missing job and another principal's are refused alike: the same
        answer, and the same audit row, so the time taken does not tell them apart."""
        try:
            job: Job | None = await self.app.get(job_id)
        except JobNotFoundError:
            job = None
        if job is None or not self.principal.sees(job):
            denied = job is not None or self.principal.owner_filter is not None
            raise ApiError(404, "not_found", f"job {job_id} does not exist", denied=denied)
        return job

    @contextlib.asynccontextmanager
    async def attempt(self, target: str, *, mutation: bool) -> AsyncIterator[Attempt]:
        """Audit what happens inside: a mutation always (``ok`` or its error code), a
        read only when it was denied. The block may name a better target (the new job)."""
        att = Attempt(target)
        try:
            with by_caller():  # this attempt's audit row is written here, not by the App
                yield att
        except (ApiError, TetherError) as exc:
            if isinstance(exc, ApiError) and exc.denied:
                await self.record(att.target, "denied", exc.code)
            elif mutation:
                await self.record(att.target, classify(exc)[1], att.detail)
            raise
        except Exception:
            if mutation:
                await self.record(att.target, "internal_error", att.detail)
            raise
        else:
            if mutation:
                await self.record(att.target, "ok", att.detail)


@dataclass
class Attempt:
    """What one audited attempt acts on, and a detail worth keeping."""

    target: str
    detail: str | None = None


def require(action: str, roles: tuple[Role, ...]) -> Callable[..., Awaitable[Caller]]:
    """A dependency: authenticate, rate-limit and authorize a request for ``action``."""

    async def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    ) -> Caller:
        api: Api = request.app.state.api
        request_id: str | None = getattr(request.state, "request_id", None)
        principal = await _authenticate(api, request, credentials)
        if principal is None:
            # Limit refusals per client address before auditing them, so a flood of bad
            # tokens cannot flood the audit log.
            address = f"addr:{request.client.host if request.client else '?'}"
            await limit(api, address, "unauthenticated", action, request.url.path, request_id)
            given = credentials is not None or bool(request.headers.get("authorization"))
            why = "invalid or revoked token" if given else "missing token"
            await api.record("unauthenticated", action, request.url.path, "denied", request_id,
                             why)  # fmt: skip
            raise ApiError(
                401,
                "unauthorized",
                f"{why}: send Authorization: Bearer <token>",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await authorize(api, principal, action, roles, request_id, request.url.path)

    return dependency


async def authorize(
    api: Api,
    principal: Principal,
    action: str,
    roles: tuple[Role, ...],
    request_id: str | None,
    path: str,
) -> Caller:
    """Rate-limit and authorize an authenticated ``principal`` for ``action``: the
    :class:`Caller` for it, or a 403 (audited as ``denied``). The API's bearer tokens and
    the dashboard's sessions both come through here."""
    await limit(api, f"token:{principal.name}", principal.name, action, path, request_id)
    caller = Caller(api, principal, action, request_id)
    if principal.role not in roles:
        await caller.record(path, "denied", f"role {principal.role}")
        needs = " or ".join(r.value for r in roles)
        raise ApiError(
            403, "forbidden", f"{action} needs a {needs} token; this one is {principal.role}"
        )
    return caller


async def totals_allowed(caller: Caller, target: str) -> None:
    """Stats, queues, keys and the metrics' job gauges are global (every principal's
    jobs). A server with ``members_see_totals`` off refuses them to members, and the
    refusal is audited like any other."""
    if caller.principal.owner_filter is not None and not caller.api.settings.members_see_totals:
        await caller.record(target, "denied", "totals are hidden from members")
        raise ApiError(403, "forbidden", "this server does not show members the totals of all jobs")


async def _authenticate(
    api: Api, request: Request, credentials: HTTPAuthorizationCredentials | None
) -> Principal | None:
    if credentials is not None:
        return await api.tokens.authenticate(credentials.credentials)
    if request.headers.get("authorization"):
        return None  # a header that is not a bearer token
    if not api.settings.allow_anonymous or await api.tokens.any_active():
        return None
    if not api.warned_open:
        api.warned_open = True
        log.warning("no API token exists: requests without a token act as admin 'anonymous'")
    return ANONYMOUS


async def limit(
    api: Api, key: str, actor: str, action: str, path: str, request_id: str | None
) -> None:
    """Take a token from ``key``'s bucket, or refuse with 429. Refusals are audited once
    per client and minute (the row says so), so a flood cannot flood the log."""
    wait = api.limiter.take(key)
    if wait is not None:
        minute = int(time.time() // 60)
        if api.refused.get(key) != minute:
            if len(api.refused) > 10_000:
                api.refused.clear()
            api.refused[key] = minute
            await api.record(actor, action, path, "rate_limited", request_id,
                             f"{key}: later refusals this minute are not recorded")  # fmt: skip
        raise ApiError(
            429,
            "rate_limited",
            f"too many requests; retry in {wait:.2f}s",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
