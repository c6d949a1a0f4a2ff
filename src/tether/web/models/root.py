"""The health check's body (:mod:`tether.web.routes.root`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class DatabaseHealth(BaseModel):
    """Whether the database answers, how fast, and whether its schema is current."""

    reachable: bool
    latency_ms: float | None
    schema_version: int | None
    expected_schema_version: int


class Health(BaseModel):
    """``ok``, ``degraded`` (works, with problems listed) or ``down`` (answered 503)."""

    status: Literal["ok", "degraded", "down"]
    database: DatabaseHealth
    active_workers: int | None
    problems: list[str]
