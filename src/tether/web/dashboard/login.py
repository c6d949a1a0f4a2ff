"""Logging in with an API token, and out."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response

from tether.web.dashboard.rendering import redirect, render
from tether.web.dashboard.sessions import (
    COOKIE,
    LOGIN_COOKIE,
    SESSION_TTL,
    CsrfRefused,
    Post,
    _sessions,
)
from tether.web.security import Api, limit

router = APIRouter(include_in_schema=False)


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
