"""Periodic schedules and the clock they go by."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from tether.ops import ScheduleRow


@runtime_checkable
class ScheduleStore(Protocol):
    """Periodic schedules: their definitions, the last tick each dealt with, their pause
    flags, and the database clock their ticks go by."""

    async def db_time(self) -> datetime:
        """The clock leases and schedules go by (PostgreSQL's ``now()``; on SQLite,
        this host's clock)."""

    async def sync_schedule(
        self, name: str, task: str, cron: str, timezone: str, start: datetime
    ) -> ScheduleRow:
        """Record a schedule's definition; a new one starts after ``start`` (its
        ``last_tick``), an existing one keeps its state. Returns the row."""

    async def advance_schedule(
        self, name: str, tick: datetime, next_tick: datetime | None, job_id: int | None
    ) -> bool:
        """Move a schedule's ``last_tick`` forward to ``tick`` (never back), with the job
        enqueued for it, if any; ``False`` if another scheduler got there first."""

    async def list_schedules(self) -> list[ScheduleRow]:
        """Every schedule row, by name."""

    async def set_schedule_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume a schedule; ``False`` if there is no such schedule."""
