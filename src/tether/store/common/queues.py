"""Queues, concurrency limits and rate limits (:class:`~tether.store.protocols.QueueStore`
and the limits' part of the admin store)."""

from __future__ import annotations

from tether import hints as h
from tether.job import LimitInfo, QueueBacklog, QueueInfo, RateLimitInfo
from tether.store.common.base import SqlBase
from tether.store.driver import Row, Tx


class QueuesSql(SqlBase):
    """Paused queues, concurrency limits and rate limits, and what waits on them.

    A change that may let jobs be claimed wakes the claimers (``tether_enqueued``):
    through the database at commit on PostgreSQL, here after commit on SQLite."""

    async def set_queue_paused(self, name: str, paused: bool, reason: str | None) -> None:
        async def body(tx: Tx) -> None:
            params = {"name": name, "paused": paused, "reason": reason}
            await tx.run(self.sql.queues.SET_QUEUE_PAUSED, params)
            if not paused:
                await tx.notify(h.ENQUEUED, [name])

        await self._transact(body)

    async def list_queues(self) -> list[QueueInfo]:
        async def body(tx: Tx) -> tuple[list[Row], list[Row]]:
            counts = await tx.all(self.sql.queues.QUEUE_COUNTS)
            return counts, await tx.all(self.sql.queues.QUEUE_FLAGS)

        count_rows, flag_rows = await self._query(body)
        counts: dict[str, dict[str, int]] = {}
        for r in count_rows:
            counts.setdefault(r["queue"], {})[r["state"]] = r["n"]
        flags = {r["name"]: (bool(r["paused"]), r["reason"]) for r in flag_rows}
        return [
            QueueInfo(name, *flags.get(name, (False, None)), counts.get(name, {}))
            for name in sorted(set(counts) | set(flags))
        ]

    async def queue_backlog(self) -> list[QueueBacklog]:
        async def body(tx: Tx) -> tuple[list[Row], list[Row], list[Row]]:
            waiting = await tx.all(self.sql.queues.QUEUE_WAITING)
            running = await tx.all(self.sql.queues.QUEUE_RUNNING)
            return waiting, running, await tx.all(self.sql.queues.QUEUE_FLAGS)

        waiting_rows, running_rows, flag_rows = await self._query(body)
        waiting = {r["queue"]: (int(r["n"]), int(r["due"] or 0)) for r in waiting_rows}
        running = {r["queue"]: int(r["n"]) for r in running_rows}
        paused = {r["name"] for r in flag_rows if r["paused"]}
        return [
            QueueBacklog(name, name in paused, *waiting.get(name, (0, 0)), running.get(name, 0))
            for name in sorted(set(waiting) | set(running) | {r["name"] for r in flag_rows})
        ]

    async def define_limit(self, name: str, kind: str, capacity: int, block_on_hold: bool) -> None:
        params = {"name": name, "kind": kind, "capacity": capacity, "block_on_hold": block_on_hold}

        async def body(tx: Tx) -> None:
            await tx.run(self.sql.queues.DEFINE_LIMIT, params)
            await tx.notify(h.ENQUEUED, [h.ANY])

        await self._transact(body)

    async def list_limits(self) -> list[LimitInfo]:
        async def body(tx: Tx) -> list[LimitInfo]:
            return [self._rows.limit(r) for r in await tx.all(self.sql.queues.LIST_LIMITS)]

        return await self._query(body)

    async def waiting_by_task(self) -> dict[tuple[str, str], int]:
        async def body(tx: Tx) -> dict[tuple[str, str], int]:
            rows = await tx.all(self.sql.queues.WAITING_BY_TASK)
            return {(r["queue"], r["task"]): r["n"] for r in rows}

        return await self._query(body)

    async def set_rate_limit(self, scope: str, name: str, per_second: float, burst: int) -> None:
        params = {"id": f"{scope}:{name}", "per_second": per_second, "burst": burst}

        async def body(tx: Tx) -> None:
            await tx.run(self.sql.queues.SET_RATE_LIMIT, params)
            await tx.notify(h.ENQUEUED, [h.ANY])

        await self._transact(body)

    async def remove_rate_limit(self, scope: str, name: str) -> bool:
        async def body(tx: Tx) -> bool:
            removed = await tx.run(self.sql.queues.REMOVE_RATE_LIMIT, {"id": f"{scope}:{name}"})
            await tx.notify(h.ENQUEUED, [h.ANY])
            return removed > 0

        return await self._transact(body)

    async def list_rate_limits(self) -> list[RateLimitInfo]:
        async def body(tx: Tx) -> list[RateLimitInfo]:
            return [_rate_limit(r) for r in await tx.all(self.sql.queues.LIST_RATE_LIMITS)]

        return await self._query(body)


def _rate_limit(row: Row) -> RateLimitInfo:
    """A :class:`RateLimitInfo` from a ``tether_rate_limits`` row with its ``tokens`` as
    of now (a bucket's id is ``scope:name``)."""
    scope, name = row["id"].split(":", 1)
    return RateLimitInfo(scope, name, row["per_second"], row["burst"], row["tokens"])
