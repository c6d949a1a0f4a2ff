"""Mounting the dashboard on the API's FastAPI app: its routes, its static files, and the
error pages of what it refuses."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from tether.web.dashboard import actions, login, pages
from tether.web.dashboard.rendering import (
    BULK_CANCEL_MAX,
    HERE,
    SECURITY_HEADERS,
    redirect,
    templates,
)
from tether.web.dashboard.sessions import CsrfRefused, LoginRequired, Sessions
from tether.web.errors import ApiError

# The routes of every module, in the one router the app includes.
router = APIRouter(include_in_schema=False)
for part in (login.router, pages.router, actions.router):
    router.include_router(part)

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
