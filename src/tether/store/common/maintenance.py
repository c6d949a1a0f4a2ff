"""Dead workers, rescue, the leader's lease and retention
(:class:`~tether.store.protocols.MaintenanceStore`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from tether import hints as h
from tether.job import Job
from tether.ops import LeaderInfo, PruneBatch
from tether.store.common.base import SqlBase
from tether.store.driver import Body, T, Tx
from tether.store.protocols import ProcessGone
from tether.store.rows import worker_process


class MaintenanceSql(SqlBase):
    """What the maintenance leader does: find dead workers, rescue their jobs, hold its
    lease, and prune what is old."""

    async def mark_dead_workers(
        self,
        process_gone: ProcessGone,
        session_grace: float,
        still: Collection[str] | None = None,
    ) -> list[str]:
        q = self.sql.maintenance

        async def body(tx: Tx) -> list[str]:
            rows = await tx.all(q.LIVE_WORKERS)
            dead = [r["id"] for r in rows if process_gone(worker_process(r))]
            if dead:
                await tx.run(q.MARK_DEAD, {"ids": dead})
            if q.DEAD_SESSIONS is not None:
                # Workers whose database session is gone (PostgreSQL).
                watched = None if still is None else list(still)
                rows = await tx.all(q.DEAD_SESSIONS, {"grace": session_grace, "still": watched})
                dead.extend(r["id"] for r in rows)
            return dead

        return await self._change(body)

    async def _before_rescue(self) -> None:
        """What a rescue does first, in transactions of its own: nothing by default
        (SQLite discards abandoned bulk enqueues)."""

    async def worker_beats(self) -> dict[str, tuple[int, float | None]]:
        async def body(tx: Tx) -> dict[str, tuple[int, float | None]]:
            rows = await tx.all(self.sql.maintenance.WORKER_BEATS)
            return {
                r["id"]: (int(r["beats"]), None if r["lease"] is None else float(r["lease"]))
                for r in rows
            }

        return await self._query(body)

    async def rescue(self, quiet: Mapping[str, int] | None = None) -> list[Job]:
        await self._before_rescue()
        q = self.sql.maintenance
        params = {"quiet": None if quiet is None else json.dumps(dict(quiet))}

        async def body(tx: Tx) -> list[Job]:
            jobs = [self._rows.job(r) for r in await tx.all(q.RESCUE, params)]
            await self._after_transitions(tx, [j.id for j in jobs])
            if jobs and not q.RESCUE_NOTIFIES:
                await tx.notify(h.ENQUEUED, [h.ANY])
            return jobs

        return await self._transact(body)

    # -- blocked jobs that wait on something that has already happened ------------------

    async def release_stuck(self, after: int, limit: int) -> tuple[list[int], int | None]:
        q = self.sql.maintenance
        params = {"after": after, "limit": limit}

        async def body(tx: Tx) -> tuple[list[int], int | None]:
            pending: list[int] = []
            if q.PENDING_STEPS is not None:
                pending = sorted(int(r[0]) for r in await tx.tuples(q.PENDING_STEPS, params))
            row = await tx.one(q.BLOCKED_BATCH, params)
            last = None if row is None or row["last"] is None else int(row["last"])
            rows = []
            if last is not None:
                rows = await tx.tuples(q.STUCK, {"after": after, "last": last})
            stuck = [int(r[0]) for r in rows]
            steps = sorted({*pending, *(int(r[1]) for r in rows)})
            if steps:
                if q.WORKFLOW_STEP is not None:
                    await tx.run(q.WORKFLOW_STEP, {"ids": steps})
                else:
                    await self._after_transitions(tx, steps)
            return sorted({*pending, *stuck}), last

        return await self._transact(body)

    # -- the leader's lease ------------------------------------------------------------

    async def _leader(self, tx: Tx, name: str) -> LeaderInfo | None:
        row = await tx.one(self.sql.maintenance.LEADER, {"name": name})
        if row is None:
            return None
        since, expires = self._time(row["since"]), self._time(row["expires_at"])
        assert since is not None and expires is not None
        return LeaderInfo(row["name"], row["holder"], since, expires, bool(row["active"]))

    async def lead(self, name: str, holder: str, ttl: float) -> LeaderInfo:
        async def body(tx: Tx) -> LeaderInfo:
            params = {"name": name, "holder": holder, "ttl": ttl}
            await tx.run(self.sql.maintenance.LEAD, params)
            info = await self._leader(tx, name)
            assert info is not None
            return info

        return await self._change(body)

    async def resign(self, name: str, holder: str) -> None:
        async def body(tx: Tx) -> None:
            await tx.run(self.sql.maintenance.RESIGN, {"name": name, "holder": holder})

        await self._change(body)

    async def get_leader(self, name: str) -> LeaderInfo | None:
        async def body(tx: Tx) -> LeaderInfo | None:
            return await self._leader(tx, name)

        return await self._query(body)

    # -- retention ---------------------------------------------------------------------

    async def _prune_dry_run(self, body: Body[T]) -> T:
        """How a dry run of :meth:`prune_jobs` runs: in a transaction, as PostgreSQL's
        always did. SQLite overrides it: a read, without the write lock."""
        return await self._transact(body)

    async def prune_jobs(
        self,
        state: str,
        older_than: float,
        limit: int,
        after: tuple[object, int] | None,
        dry_run: bool,
        failed_age: float | None = None,
    ) -> PruneBatch:
        q = self.sql.maintenance
        params: dict[str, Any] = {"state": state, "age": older_than, "limit": limit}
        query = q.PRUNE_PICK
        if after is not None:
            query = q.PRUNE_PICK_AFTER
            params.update(after_at=after[0], after_id=after[1])
        if not dry_run:
            query += q.PRUNE_SKIP_LOCKED

        async def body(tx: Tx) -> PruneBatch:
            rows = await tx.all(query, params)
            if not rows:
                return PruneBatch({}, 0)
            ids = [r["id"] for r in rows]
            linked = [r["id"] for r in rows if r["linked"]]
            kept: set[int] = set()
            if linked:
                keep = {"ids": linked, "failed_age": failed_age}
                kept = {int(r["id"]) for r in await tx.all(q.IN_LIVE_WORKFLOW, keep)}
            doomed = {"ids": [i for i in ids if i not in kept]}
            counts = {}
            for kind, table, where in q.PRUNE_TABLES:
                if dry_run:
                    row = await tx.one(f"SELECT COUNT(*) AS n FROM {table} WHERE {where}", doomed)
                    counts[kind] = int(row["n"]) if row else 0
                else:
                    counts[kind] = await tx.run(f"DELETE FROM {table} WHERE {where}", doomed)
            last = rows[-1]
            return PruneBatch(counts, len(rows), len(kept), (last["finished_at"], last["id"]))

        if dry_run:
            return await self._prune_dry_run(body)
        return await self._transact(body)

    async def prune_rows(self, kind: str, older_than: float, limit: int, dry_run: bool) -> int:
        if kind not in self.sql.maintenance.PRUNE_ROWS:
            raise ValueError(f"unknown kind of rows to prune: {kind!r}")
        table, pick = self.sql.maintenance.PRUNE_ROWS[kind]
        param = self.sql.fragments.param

        async def count(tx: Tx) -> int:
            row = await tx.one(f"SELECT COUNT(*) AS n FROM ({pick}) AS old", {"age": older_than})
            return int(row["n"]) if row else 0

        async def delete(tx: Tx) -> int:
            query = f"DELETE FROM {table} WHERE id IN ({pick} LIMIT {param('limit')})"
            return await tx.run(query, {"age": older_than, "limit": limit})

        if dry_run:
            return await self._query(count)
        return await self._change(delete)
