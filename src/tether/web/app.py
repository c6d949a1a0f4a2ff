"""The FastAPI application: ``create_app(tether_app)``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from tether import __version__
from tether.app import App
from tether.web import dashboard, errors
from tether.web.guard import Guard
from tether.web.routes import control, jobs, root, schedules, stream
from tether.web.security import Api
from tether.web.settings import ApiSettings

log = logging.getLogger("tether.web")

DESCRIPTION = """\
The REST API of a tether queue. Send a token from `tether token create` as
`Authorization: Bearer <token>`. Admins act on every job; members on the jobs they
enqueued (another principal's job answers 404); viewers only read. Errors are JSON:
`{"code": ..., "message": ..., "request_id": ...}`, with stable codes.
"""


def create_app(tether_app: App, settings: ApiSettings | None = None) -> FastAPI:
    """The REST API, live events, ``/metrics`` and ``/health`` for ``tether_app``.

    Under a server, the lifespan opens the database (and, on PostgreSQL, starts
    listening for notifications) at start-up, and closes it at shutdown.
    """
    settings = settings or ApiSettings()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await tether_app.admin.listen()
        try:
            yield
        finally:
            await tether_app.close()

    api = FastAPI(
        title="tether",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        # The interactive docs load scripts from a CDN, which the dashboard's CSP would
        # forbid: they are off unless asked for (settings.docs, `tether serve --docs`).
        docs_url="/docs" if settings.docs else None,
        redoc_url="/redoc" if settings.docs else None,
        openapi_tags=[
            {"name": "jobs", "description": "Enqueue, read and steer jobs."},
            {"name": "cancellations", "description": "Cancellation records."},
            {"name": "queues", "description": "Queues, concurrency keys and resource pools."},
            {"name": "workers", "description": "Workers and job counts."},
            {"name": "audit", "description": "Who changed what."},
            {"name": "events", "description": "Live transitions (Server-Sent Events)."},
            {"name": "status", "description": "Health and metrics."},
        ],
    )
    api.state.api = Api.build(tether_app, settings)
    errors.install(api)
    api.include_router(jobs.router, prefix="/api")
    api.include_router(control.router, prefix="/api")
    api.include_router(schedules.router, prefix="/api")
    api.include_router(stream.router, prefix="/api")
    api.include_router(root.router)
    dashboard.install(api)
    api.add_middleware(Guard, max_body_bytes=settings.max_body_bytes)
    _trace_requests(api, tether_app)
    return api


def _trace_requests(api: FastAPI, tether_app: App) -> None:
    """An App that traces (``tether.otel.Tracing``) gets its requests traced too: each
    continues the caller's trace, so an enqueue made through the API joins it."""
    tracing = [h for h in tether_app.hooks.all if type(h).__module__ == "tether.otel"]
    if tracing:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        provider = getattr(tracing[0], "tracer_provider", None)
        api.add_middleware(OpenTelemetryMiddleware, tracer_provider=provider)


def server_config(api: Any, host: str, port: int, settings: ApiSettings, **kwargs: Any) -> Any:
    """The uvicorn configuration ``tether serve`` runs ``api`` with: request headers up to
    ``settings.max_header_bytes`` (larger get the HTTP server's plain 400). The h11
    protocol always, so that limit holds whichever HTTP parsers are installed."""
    import uvicorn

    return uvicorn.Config(
        api,
        host=host,
        port=port,
        server_header=False,
        http="h11",
        h11_max_incomplete_event_size=settings.max_header_bytes,
        **kwargs,
    )
