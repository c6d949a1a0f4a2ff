"""Reading jobs and requesting changes to them (part of
:class:`~tether.store.protocols.JobStore`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tether import hints as h
from tether.job import Job, JobEvent, JobFilter
from tether.states import JobState
from tether.store.common.base import SqlBase
from tether.store.driver import Tx


class JobsSql(SqlBase):
    """Jobs by id or filter, their events and links; cancel, pause, resume, retry."""

    async def get(self, job_id: int) -> Job | None:
        async def body(tx: Tx) -> Job | None:
            return (await self._jobs(tx, [job_id])).get(job_id)

        return await self._query(body)

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        f = self.sql.fragments
        where = ["1=1"]
        params: dict[str, Any] = {"limit": flt.limit, "offset": flt.offset}
        if flt.states is not None:
            # The states as literals, not a parameter: PostgreSQL's index of jobs by state
            # leaves the succeeded ones out (migration 0027), and only a plan that sees the
            # states can use it (a prepared statement's generic plan could not). JobState
            # admits nothing but the states' own names into the text.
            states = ", ".join(sorted({f"'{JobState(s).value}'" for s in flt.states}))
            where.append(f"state IN ({states})" if states else "1=0")
        for column in ("queue", "task", "key", "owner", "worker_id", "parent_id"):
            value = getattr(flt, column)
            if value is not None:
                where.append(f"{column} = {f.param(column)}")
                params[column] = value
        if flt.meta:
            where.append(f.meta_has("meta"))
            params["meta"] = json.dumps(dict(flt.meta), separators=(",", ":"))
        if flt.ids is not None:
            where.append(f.in_list("id", "ids"))
            params["ids"] = list(flt.ids)
        query = self.sql.jobs.LIST_JOBS.format(where=" AND ".join(where))

        async def body(tx: Tx) -> list[Job]:
            return [self._rows.job(r) for r in await tx.all(query, params)]

        return await self._query(body)

    async def count_by_state(self) -> dict[str, int]:
        async def body(tx: Tx) -> dict[str, int]:
            return {r["state"]: r["n"] for r in await tx.all(self.sql.jobs.COUNT_BY_STATE)}

        return await self._query(body)

    async def events(self, job_id: int) -> list[JobEvent]:
        async def body(tx: Tx) -> list[JobEvent]:
            rows = await tx.all(self.sql.jobs.EVENTS, {"id": job_id})
            return [self._rows.event(r) for r in rows]

        return await self._query(body)

    async def request_cancel(
        self,
        job_id: int,
        reason: str | None,
        force: bool,
        actor: str | None,
        cascade: bool = True,
    ) -> Job:
        params = {
            "id": job_id,
            "reason": reason,
            "force": force,
            "actor": actor,
            "cascade": cascade,
        }
        return await self._control(self.sql.jobs.CANCEL, params, h.CANCEL)

    async def request_pause(self, job_id: int, reason: str | None, actor: str | None) -> Job:
        params = {"id": job_id, "reason": reason, "actor": actor}
        return await self._control(self.sql.jobs.PAUSE, params, h.CONTROL)

    async def resume(self, job_id: int, budget: int | None, actor: str | None) -> Job:
        params = {"id": job_id, "budget": budget, "actor": actor}
        return await self._control(self.sql.jobs.RESUME, params, h.CONTROL)

    async def retry(self, job_id: int, actor: str | None) -> Job:
        return await self._control(self.sql.jobs.RETRY, {"id": job_id, "actor": actor}, h.CONTROL)

    async def _control(self, query: str, params: dict[str, Any], running_hint: str) -> Job:
        """Run a control request ``query`` on the job ``params["id"]``: one statement
        that changes the job and returns it (with ``announced``), or nothing when there
        is nothing to change. A flag set on a running job is for its worker, on
        ``running_hint``; any other change is a transition."""
        job_id: int = params["id"]

        async def body(tx: Tx) -> Job:
            row = await tx.one(query, params)
            if row is None:  # nothing to change: report the job as it is
                return await self._job(tx, job_id)
            job = self._rows.job(row)
            running = job.state == "running"
            if not running:
                await self._after_transitions(tx, [job_id])
            # PostgreSQL's statement has announced it all already (its trigger the
            # transition, its NOTIFY the flag of a running job), in the same round trip.
            if not row["announced"]:
                if running:
                    await tx.notify(running_hint, [str(job_id)])
                elif job.state == "queued":
                    await tx.notify(h.ENQUEUED, [job.queue])
            return job

        return await self._change(body)

    async def downstream(self, job_ids: Sequence[int]) -> list[Job]:
        async def body(tx: Tx) -> list[Job]:
            rows = await tx.all(self.sql.jobs.DOWNSTREAM, {"ids": list(job_ids)})
            return [self._rows.job(r) for r in rows]

        return await self._query(body)

    async def dependencies(self, job_id: int) -> tuple[list[int], list[int]]:
        async def body(tx: Tx) -> tuple[list[int], list[int]]:
            up = await tx.all(self.sql.jobs.UPSTREAM_IDS, {"id": job_id})
            down = await tx.all(self.sql.jobs.DOWNSTREAM_IDS, {"id": job_id})
            return [r["id"] for r in up], [r["id"] for r in down]

        return await self._query(body)
