"""``app.schedules``: the schedules this App declares, and every schedule the
database records (list, pause, resume, remove). Declaring a periodic task is
:meth:`tether.App.periodic`."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

from tether.audit import audited
from tether.errors import ConfigError, ScheduleNotFoundError
from tether.facades.base import Facade
from tether.job import JSON
from tether.new_job import declarations, new_job
from tether.ops import ScheduleRow
from tether.periodic import DEFAULT_GRACE, Missed, Schedule
from tether.task import EnqueueOptions, Task

if TYPE_CHECKING:
    from tether.app import App


class Schedules(Facade):
    """Schedules: ``declared`` holds this App's, by name; the database holds every
    worker's, which the maintenance leader fires (each change audited)."""

    def __init__(self, app: App) -> None:
        super().__init__(app)
        self.declared: dict[str, Schedule] = {}

    def declare(
        self,
        task: str | Task,
        *,
        cron: str,
        timezone: str = "UTC",
        args: dict[str, JSON] | None = None,
        name: str | None = None,
        missed: Missed = "none",
        jitter: float = 0.0,
        grace: float = DEFAULT_GRACE,
        queue: str | None = None,
    ) -> Schedule:
        """Enqueue a registered task once per tick of ``cron``; see
        :meth:`tether.App.periodic`."""
        task_name = task.name if isinstance(task, Task) else task
        if task_name not in self.app.tasks:
            raise ConfigError(f"cannot schedule unknown task {task_name!r}; register it first")
        schedule = Schedule(
            name=name or task_name,
            task=task_name,
            cron=cron,
            timezone=timezone,
            args=dict(args or {}),
            missed=missed,
            jitter=jitter,
            grace=grace,
            queue=queue,
        )
        if schedule.name in self.declared:
            raise ConfigError(f"a schedule named {schedule.name!r} already exists")
        # Refuse args that could never be enqueued now, not at the first tick.
        new_job(
            self.app.tasks,
            task_name,
            schedule.args,
            EnqueueOptions(queue=queue),
            max_payload_bytes=self.app.config.max_payload_bytes,
        )
        self.declared[schedule.name] = schedule
        return schedule

    @audited("schedule.pause", lambda a: f"schedule:{a['name']}")
    async def pause(self, name: str) -> None:
        """Stop enqueueing a schedule's ticks (ticks that pass meanwhile are skipped)."""
        await self._set_paused(name, True)

    @audited("schedule.resume", lambda a: f"schedule:{a['name']}")
    async def resume(self, name: str) -> None:
        """Enqueue a paused schedule's ticks again, from its next tick on."""
        await self._set_paused(name, False)

    async def _set_paused(self, name: str, paused: bool) -> None:
        store = await self._store()
        if await store.set_schedule_paused(name, paused):
            return
        if name not in self.declared:
            raise ScheduleNotFoundError(f"no schedule named {name!r}")
        # Known to this app but not yet recorded by a worker: record it, then set the flag.
        mine = declarations(
            self.app.tasks,
            {name: self.declared[name]},
            max_payload_bytes=self.app.config.max_payload_bytes,
        )
        await store.register_schedules(mine, await store.db_time(), None)
        await store.set_schedule_paused(name, paused)

    @audited("schedule.remove", lambda a: f"schedule:{a['name']}")
    async def remove(self, name: str) -> int:
        """Delete a schedule's row, so the leader fires it no more; returns how many
        live workers still declare it (each records it again when it next starts:
        remove it from their code first)."""
        store = await self._store()
        if not await store.delete_schedule(name):
            raise ScheduleNotFoundError(f"no schedule named {name!r}")
        return (await store.declared_schedules()).get(name, 0)

    # Last: below it, ``list`` in the class body would name this method, not the type.
    async def list(self) -> list[ScheduleRow]:
        """Every schedule: those the database knows (declared by any worker) and this
        app's, with the last tick dealt with, the next one, the last job enqueued, and
        how many live workers declare it."""
        store = await self._store()
        rows = {r.name: r for r in await store.list_schedules()}
        declared = await store.declared_schedules()
        now = await store.db_time()
        for name, schedule in self.declared.items():
            if name not in rows:
                rows[name] = ScheduleRow(
                    name,
                    schedule.task,
                    schedule.cron,
                    schedule.timezone,
                    False,
                    None,
                    None,
                    None,
                    None,
                )
        out = []
        for name in sorted(rows):
            row = rows[name]
            # The definition the leader fires, else (not recorded yet) this app's.
            fired: Schedule | None = self.declared.get(name)
            if row.definition is not None:
                with contextlib.suppress(ConfigError):
                    fired = Schedule.load(name, row.definition)[0]
            next_tick = row.next_tick
            if fired is not None:
                next_tick = fired.next_tick(max(now, row.last_tick or now))
            out.append(
                dataclasses.replace(row, next_tick=next_tick, declared_by=declared.get(name, 0))
            )
        return out
