"""Periodic schedules: list them, pause and resume them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from tether.web.body import JsonRoute
from tether.web.models import ScheduleList, ScheduleOut
from tether.web.routes import ERRORS
from tether.web.security import ADMINS, ALL_ROLES, Caller, require

router = APIRouter(responses=ERRORS, route_class=JsonRoute)

ScheduleName = Annotated[
    str,
    Path(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f/]+$", description="Schedule."),
]


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
