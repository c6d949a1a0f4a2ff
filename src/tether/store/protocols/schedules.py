"""Periodic schedules and the clock they go by."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from tether.ops import ScheduleDeclaration, ScheduleRegistration, ScheduleRow


@runtime_checkable
class ScheduleStore(Protocol):
    """Periodic schedules: their definitions, the last tick each dealt with, their pause
    flags, and the database clock their ticks go by."""

    async def db_time(self) -> datetime:
        """The clock leases and schedules go by (PostgreSQL's ``now()``; on SQLite,
        this host's clock)."""

    async def register_schedules(
        self, schedules: Sequence[ScheduleDeclaration], start: datetime, holder: str | None
    ) -> ScheduleRegistration:
        """Record the definitions a worker (``holder``) declares. A new schedule starts
        after ``start`` (its ``last_tick``); an existing one keeps its ticks and pause
        flag and takes the new definition if it differs (the newest declaration wins;
        the replaced rows are returned). Rows someone else holds locked are skipped,
        never waited for, and returned as pending."""

    async def advance_schedule(
        self, name: str, tick: datetime, next_tick: datetime | None, job_id: int | None
    ) -> bool:
        """Move a schedule's ``last_tick`` forward to ``tick`` (never back), with the job
        enqueued for it, if any; ``False`` if another scheduler got there first, or the
        row is locked (skipped, not waited for: the tick's job is idempotent, and the
        next round moves it)."""

    async def list_schedules(self) -> list[ScheduleRow]:
        """Every schedule row, by name."""

    async def declared_schedules(self) -> dict[str, int]:
        """How many live (active or draining) workers declare each schedule name."""

    async def set_schedule_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume a schedule; ``False`` if there is no such schedule."""

    async def delete_schedule(self, name: str) -> bool:
        """Delete a schedule's row; ``False`` if there is none. A worker that declares
        it records it again when it next starts."""
