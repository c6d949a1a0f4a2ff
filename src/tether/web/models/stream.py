"""The messages of the live event stream (:mod:`tether.web.routes.stream`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from tether.states import JobState


class Transition(BaseModel):
    """One message of the live event stream (the ``data`` of an SSE ``transition``)."""

    event_id: int
    job_id: int
    from_state: JobState | None
    to_state: JobState
    at: datetime
    queue: str | None
    task: str | None
    owner: str | None
    worker_id: str | None
    actor: str | None
    reason: str | None
