"""The live feed of job events (:class:`~tether.store.protocols.FeedStore`) and an owner's
cancellations (part of :class:`~tether.store.protocols.CancellationStore`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from tether.errors import RowLocked
from tether.job import CancellationRow, FeedEvent
from tether.store.common.base import SqlBase
from tether.store.driver import Tx


class FeedSql(SqlBase):
    """Job events in order, for the API's live feed, and an owner's cancellations."""

    async def feed(
        self,
        after_id: int,
        *,
        job_id: int | None,
        queue: str | None,
        owner: str | None,
        states: Sequence[str] | None,
        limit: int,
    ) -> list[FeedEvent]:
        f = self.sql.fragments
        where = [f"e.id > {f.param('after_id')}"]
        params: dict[str, Any] = {"after_id": after_id, "limit": limit}
        for column, name, value in (
            ("e.job_id", "job_id", job_id),
            ("j.queue", "queue", queue),
            ("j.owner", "owner", owner),
        ):
            if value is not None:
                where.append(f"{column} = {f.param(name)}")
                params[name] = value
        if states is not None:
            where.append(f.in_list("e.to_state", "states"))
            params["states"] = list(states)
        query = self.sql.feed.FEED.format(where=" AND ".join(where))

        async def body(tx: Tx) -> list[FeedEvent]:
            return [self._api.feed(r) for r in await tx.all(query, params)]

        return await self._query(body)

    async def announce_follower(self, ttl: float) -> None:
        sql = self.sql.feed.ANNOUNCE_FOLLOWER
        if sql is None:
            return

        async def body(tx: Tx) -> None:
            await tx.run(sql, {"ttl": ttl})

        # Bounded: anyone may hold the row (another feed renewing it, an operator in
        # psql); one that stays held is someone's, and the next renewal tries again.
        with contextlib.suppress(RowLocked):
            await self._transact_bounded(body)

    async def last_event_id(self) -> int:
        async def body(tx: Tx) -> int:
            row = await tx.one(self.sql.feed.LAST_EVENT_ID)
            return int(row["n"]) if row else 0

        return await self._query(body)

    async def list_owned_cancellations(
        self, owner: str, *, limit: int, offset: int
    ) -> list[CancellationRow]:
        async def body(tx: Tx) -> list[CancellationRow]:
            params = {"owner": owner, "limit": limit, "offset": offset}
            rows = await tx.all(self.sql.feed.OWNED_CANCELLATIONS, params)
            return [self._rows.cancellation(r) for r in rows]

        return await self._query(body)
