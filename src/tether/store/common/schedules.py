"""Periodic schedules and the clock they go by
(:class:`~tether.store.protocols.ScheduleStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tether.ops import ScheduleDeclaration, ScheduleRegistration, ScheduleRow
from tether.store.common.base import SqlBase
from tether.store.driver import Row, Tx


class SchedulesSql(SqlBase):
    """Schedules' definitions, the last tick each dealt with, and their pause flags."""

    async def db_time(self) -> datetime:
        """The database clock, which leases and schedules go by. On SQLite it is this
        process's clock as SQLite reads it (every process on the file has its own;
        leases and schedules on SQLite are as good as the host clocks agree)."""

        async def body(tx: Tx) -> datetime:
            row = await tx.one(self.sql.schedules.DB_TIME)
            assert row is not None
            now = self._time(row["now"])
            assert now is not None
            return now

        return await self._query(body)

    def _time_param(self, value: datetime | None) -> Any:
        """A time as a query parameter: as it is by default (PostgreSQL's driver sends
        datetimes); SQLite overrides it, for its times are Unix seconds."""
        return value

    def _schedule(self, row: Row) -> ScheduleRow:
        return ScheduleRow(
            name=row["name"],
            task=row["task"],
            cron=row["cron"],
            timezone=row["timezone"],
            paused=bool(row["paused"]),
            last_tick=self._time(row["last_tick"]),
            next_tick=self._time(row["next_tick"]),
            last_run_at=self._time(row["last_run_at"]),
            last_job_id=row["last_job_id"],
            definition=row["definition"],
            defined_at=self._time(row["defined_at"]),
            defined_by=row["defined_by"],
        )

    async def register_schedules(
        self, schedules: Sequence[ScheduleDeclaration], start: datetime, holder: str | None
    ) -> ScheduleRegistration:
        q = self.sql.schedules
        wanted = {s.name: s for s in schedules}

        async def body(tx: Tx) -> ScheduleRegistration:
            # The existing rows, locked, except those someone else holds (PostgreSQL
            # skips them: they are pending, tried again at the next round).
            held = {
                r["name"]: self._schedule(r)
                for r in await tx.all(q.LOCK_SCHEDULES, {"names": list(wanted)})
            }
            out = ScheduleRegistration()
            for name, s in wanted.items():
                params: dict[str, Any] = {
                    "name": name,
                    "task": s.task,
                    "cron": s.cron,
                    "timezone": s.timezone,
                    "definition": s.definition,
                    "holder": holder,
                }
                old = held.get(name)
                if old is None:
                    params["start"] = self._time_param(start)
                    # Never waits on a row: DO NOTHING when it exists (held by someone).
                    if await tx.one(q.INSERT_SCHEDULE, params) is None:
                        out.pending.append(name)
                elif old.definition != s.definition:
                    await tx.run(q.REDEFINE_SCHEDULE, params)
                    if old.definition is not None:
                        out.replaced.append(old)
            return out

        return await self._transact(body)

    async def advance_schedule(
        self, name: str, tick: datetime, next_tick: datetime | None, job_id: int | None
    ) -> bool:
        params = {
            "tick": self._time_param(tick),
            "next": self._time_param(next_tick),
            "job": job_id,
            "name": name,
        }

        async def body(tx: Tx) -> bool:
            return await tx.run(self.sql.schedules.ADVANCE_SCHEDULE, params) > 0

        return await self._change(body)

    async def list_schedules(self) -> list[ScheduleRow]:
        async def body(tx: Tx) -> list[ScheduleRow]:
            return [self._schedule(r) for r in await tx.all(self.sql.schedules.LIST_SCHEDULES)]

        return await self._query(body)

    async def declared_schedules(self) -> dict[str, int]:
        async def body(tx: Tx) -> dict[str, int]:
            rows = await tx.all(self.sql.schedules.DECLARED_SCHEDULES)
            return {r["name"]: int(r["workers"]) for r in rows}

        return await self._query(body)

    async def delete_schedule(self, name: str) -> bool:
        q = self.sql.schedules

        async def body(tx: Tx) -> bool:
            if q.DELETE_LOCK_TIMEOUT is not None:
                await tx.run(q.DELETE_LOCK_TIMEOUT)
            return await tx.run(q.DELETE_SCHEDULE, {"name": name}) > 0

        return await self._transact(body)

    async def set_schedule_paused(self, name: str, paused: bool) -> bool:
        async def body(tx: Tx) -> bool:
            params = {"paused": paused, "name": name}
            return await tx.run(self.sql.schedules.SET_SCHEDULE_PAUSED, params) > 0

        return await self._change(body)
