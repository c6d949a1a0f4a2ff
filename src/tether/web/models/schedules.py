"""The bodies of the schedule routes (:mod:`tether.web.routes.schedules`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from tether.ops import ScheduleRow


class ScheduleOut(BaseModel):
    """A periodic schedule: its cron, whether it is paused, and what it did last."""

    name: str
    task: str
    cron: str
    timezone: str
    paused: bool
    next_tick: datetime | None
    last_tick: datetime | None
    last_run_at: datetime | None
    last_job_id: int | None
    # How many live workers declare it; 0: none does, and it fires until removed
    # (`tether schedule remove`).
    declared_by: int | None = None

    @classmethod
    def of(cls, row: ScheduleRow) -> ScheduleOut:
        """The API view of a schedule."""
        return cls(
            name=row.name,
            task=row.task,
            cron=row.cron,
            timezone=row.timezone,
            paused=row.paused,
            next_tick=None if row.paused else row.next_tick,
            last_tick=row.last_tick,
            last_run_at=row.last_run_at,
            last_job_id=row.last_job_id,
            declared_by=row.declared_by,
        )


class ScheduleList(BaseModel):
    """Every schedule, by name."""

    items: list[ScheduleOut]
