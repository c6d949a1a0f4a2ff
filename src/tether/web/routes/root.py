"""At the root: ``/health`` (no token needed) and ``/metrics`` (any token)."""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from tether import metrics
from tether.web.models import DatabaseHealth, Health
from tether.web.routes import ERRORS
from tether.web.security import ALL_ROLES, Api, Caller, require, totals_allowed

router = APIRouter()
log = logging.getLogger("tether.web")
SLOW_MS = 500.0


@router.get(
    "/health",
    response_model=Health,
    tags=["status"],
    summary="Database reachability and degradation",
    responses={503: {"model": Health, "description": "The database does not answer."}},
)
async def health(request: Request) -> JSONResponse:
    api: Api = request.app.state.api
    expected = api.app.admin.expected_schema_version()
    problems: list[str] = []
    started = time.monotonic()
    # No wait_for here: cancelling a call blocked on a partitioned database waits for
    # the database. Every store call has its own deadline (StoreConfig).
    try:
        version = await api.app.admin.schema_version()
        missing = await api.app.admin.missing_migrations()
    except Exception as exc:
        log.warning("health: database unreachable: %s", exc)
        down = Health(
            status="down",
            database=DatabaseHealth(
                reachable=False,
                latency_ms=None,
                schema_version=None,
                expected_schema_version=expected,
            ),
            active_workers=None,
            problems=["the database does not answer"],
        )
        return JSONResponse(down.model_dump(mode="json"), status_code=503)
    latency = (time.monotonic() - started) * 1000
    if latency > SLOW_MS:
        problems.append(f"the database answered slowly ({latency:.0f} ms)")
    if missing:
        gaps = ", ".join(str(v) for v in missing)
        problems.append(f"the schema lacks migration(s) {gaps}: run `tether migrate`")
    active = None
    try:
        workers = await api.app.admin.workers()
        active = sum(1 for w in workers if w.state == "active")
        if not active:
            problems.append("no active worker: jobs are not running")
    except Exception as exc:
        problems.append(f"workers could not be read: {type(exc).__name__}")
    body = Health(
        status="degraded" if problems else "ok",
        database=DatabaseHealth(
            reachable=True,
            latency_ms=round(latency, 2),
            schema_version=version,
            expected_schema_version=expected,
        ),
        active_workers=active,
        problems=problems,
    )
    return JSONResponse(body.model_dump(mode="json"))


@router.get(
    "/metrics",
    tags=["status"],
    summary="Prometheus metrics (any token; not members where totals are hidden)",
    response_class=Response,
    responses={
        **ERRORS,
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
    },
)
async def metrics_endpoint(
    caller: Annotated[Caller, Depends(require("metrics.read", ALL_ROLES))],
) -> Response:
    # The database gauges name every queue and count every principal's jobs.
    await totals_allowed(caller, "/metrics")
    return Response(await metrics.render(caller.app), media_type=metrics.CONTENT_TYPE_LATEST)
