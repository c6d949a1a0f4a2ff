"""Periodic schedules: list them, pause and resume them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel

from tether.ops import ScheduleRow
from tether.web.body import JsonRoute
from tether.web.routes import ERRORS
from tether.web.security import ADMINS, ALL_ROLES, Caller, require

router = APIRouter(responses=ERRORS, route_class=JsonRoute)

ScheduleName = Annotated[
    str,
    Path(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f/]+$", description="Schedule."),
]


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


@router.get(
    "/schedules",
    response_model=ScheduleList,
    tags=["schedules"],
    summary="Periodic schedules: next tick, last tick and last job",
)
async def list_schedules(
    caller: Annotated[Caller, Depends(require("schedule.list", ALL_ROLES))],
) -> ScheduleList:
    return ScheduleList(items=[ScheduleOut.of(r) for r in await caller.app.schedules.list()])


async def _one(caller: Caller, name: str) -> ScheduleOut:
    return next(ScheduleOut.of(r) for r in await caller.app.schedules.list() if r.name == name)


@router.post(
    "/schedules/{name}/pause",
    response_model=ScheduleOut,
    tags=["schedules"],
    summary="Stop enqueueing a schedule's ticks (admin)",
)
async def pause_schedule(
    name: ScheduleName,
    caller: Annotated[Caller, Depends(require("schedule.pause", ADMINS))],
) -> ScheduleOut:
    async with caller.attempt(f"schedule:{name}", mutation=True):
        await caller.app.schedules.pause(name)
    return await _one(caller, name)


@router.post(
    "/schedules/{name}/resume",
    response_model=ScheduleOut,
    tags=["schedules"],
    summary="Enqueue a paused schedule's ticks again (admin)",
)
async def resume_schedule(
    name: ScheduleName,
    caller: Annotated[Caller, Depends(require("schedule.resume", ADMINS))],
) -> ScheduleOut:
    async with caller.attempt(f"schedule:{name}", mutation=True):
        await caller.app.schedules.resume(name)
    return await _one(caller, name)
