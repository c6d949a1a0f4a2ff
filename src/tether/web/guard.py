"""The outermost layer of every request: its id, the body size limit, the refusal of
cross-site mutations, the last-resort error answer, and the request counter.

A browser says where a request comes from (``Sec-Fetch-Site``, ``Origin``). A mutation
(any method but GET, HEAD and OPTIONS) that another site sent is refused with 403 before
anything runs: a page on another port of the same machine must not steer a tokenless
loopback server. Clients that are not browsers send neither header and are not affected.

Every such refusal is one audit row (actor: the token's or the dashboard session's
principal when the request carries a valid one, else ``unauthenticated``), at most
:data:`AUDITED_PER_MINUTE` per client address and minute so a hostile page cannot flood
the log; the row that reaches the cap says so.

A pure ASGI middleware, so it sees a streamed body chunk by chunk (a missing or lying
``Content-Length`` does not get past the limit) and catches whatever the app raises
before anything generic could answer with a traceback.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether import metrics, strictint
from tether.web.dashboard.sessions import COOKIE as SESSION_COOKIE

log = logging.getLogger("tether.web")
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_SITE = frozenset({"same-origin", "none"})  # "none": typed in, or a bookmark
AUDITED_PER_MINUTE = 30


def cross_site(method: str, headers: Headers) -> bool:
    """Whether a browser sent this mutation from another origin."""
    if method in SAFE_METHODS:
        return False
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site not in SAME_SITE
    origin = headers.get("origin")
    if origin is None:
        return False
    host = headers.get("host", "")
    return origin.split("://", 1)[-1].rstrip("/") != host


class BodyTooLarge(HTTPException):
    """The request body passed the limit while the app was reading it. An HTTPException,
    so that the framework's body parsing lets it through as a 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds {limit} bytes")


class Guard:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        # (client address, minute) -> cross-site refusals audited so far.
        self._audited: dict[tuple[str, int], int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        given = headers.get("x-request-id", "")
        # A client's id is kept if it is tame; anything else could forge log lines.
        request_id = given if REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        status = [500]
        started = [False]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
                status[0] = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        try:
            if cross_site(scope.get("method", ""), headers):
                await self._answer(send_with_id, request_id, 403, "cross_site")
                await self._audit_cross_site(scope, headers, request_id)
                return
            length = headers.get("content-length")
            if length is not None and strictint.parse(length, 0, self.max_body_bytes) is None:
                await self._answer(send_with_id, request_id, 413, "payload_too_large")
                return
            received = [0]

            async def counted() -> Message:
                message = await receive()
                if message["type"] == "http.request":
                    received[0] += len(message.get("body", b""))
                    if received[0] > self.max_body_bytes:
                        raise BodyTooLarge(self.max_body_bytes)
                return message

            await self.app(scope, counted, send_with_id)
        except BodyTooLarge:
            if not started[0]:
                await self._answer(send_with_id, request_id, 413, "payload_too_large")
        except Exception:
            # The traceback goes to the server's log, never to the client.
            log.exception("request %s failed", request_id)
            if not started[0]:
                await self._answer(send_with_id, request_id, 500, "internal_error")
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            metrics.http_request(scope.get("method", "?"), route, status[0])

    async def _audit_cross_site(self, scope: Scope, headers: Headers, request_id: str) -> None:
        """One audit row for a refused cross-site mutation (never raises: the refusal
        stands whether or not its row is written)."""
        api = getattr(getattr(scope.get("app"), "state", None), "api", None)
        if api is None:
            return
        client = scope.get("client")
        address = str(client[0]) if client else "?"
        key = (address, int(time.time() // 60))
        count = self._audited.get(key, 0) + 1
        if count > AUDITED_PER_MINUTE:
            return
        if len(self._audited) > 10_000:
            self._audited.clear()
        self._audited[key] = count
        method = str(scope.get("method", "?"))
        path = str(scope.get("path", ""))
        if path == "/login":
            action = "dashboard.login"
        elif path.startswith("/api/"):
            action = f"api.{method.lower()}"
        else:
            action = "dashboard.post"
        source = headers.get("sec-fetch-site") or f"origin {headers.get('origin', '?')[:200]}"
        detail = f"a browser sent this change from another site ({source})"
        if count == AUDITED_PER_MINUTE:
            detail += f"; later cross-site refusals from {address} this minute are not recorded"
        try:
            actor = await self._actor(scope, headers, api)
            await api.record(actor, action, path[:500], "denied", request_id, detail)
        except Exception:
            log.exception("request %s: the cross-site refusal was not audited", request_id)

    @staticmethod
    async def _actor(scope: Scope, headers: Headers, api: Any) -> str:
        """Who sent it, when the request carries valid credentials: a bearer token, or
        the dashboard's session cookie."""
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        principal = None
        if scheme.lower() == "bearer" and token.strip():
            principal = await api.tokens.authenticate(token.strip())
        else:
            sessions = getattr(scope["app"].state, "dashboard_sessions", None)
            cookie = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE)
            session = sessions.get(cookie) if sessions is not None and cookie else None
            if session is not None:
                principal = await api.tokens.authenticate(session.token)
        return str(principal.name) if principal is not None else "unauthenticated"

    async def _answer(self, send: Send, request_id: str, status: int, code: str) -> None:
        messages = {
            "payload_too_large": f"the request body exceeds {self.max_body_bytes} bytes",
            "internal_error": "internal error",
            "cross_site": "refused: a browser sent this change from another site",
        }
        body: dict[str, Any] = {
            "code": "forbidden" if code == "cross_site" else code,
            "message": messages[code],
            "request_id": request_id,
        }
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
