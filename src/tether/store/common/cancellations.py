"""Cancellation records (the records' part of
:class:`~tether.store.protocols.CancellationStore`)."""

from __future__ import annotations

import json

from tether import hints as h
from tether.job import CancellationRow
from tether.store.common.base import SqlBase
from tether.store.driver import Tx


class CancellationsSql(SqlBase):
    """A cancellation's record: created once per job or request, then updated step by
    step by whoever carries it out."""

    async def create_cancellation(
        self,
        cancellation_id: str,
        *,
        job_id: int,
        request_id: str | None,
        reason: str | None,
        force: bool,
        cascade: bool,
        initiated_by: str | None,
    ) -> tuple[CancellationRow, bool]:
        params = {
            "id": cancellation_id,
            "job_id": job_id,
            "request_id": request_id,
            "reason": reason,
            "force": force,
            "cascade": cascade,
            "initiated_by": initiated_by,
        }

        async def body(tx: Tx) -> tuple[CancellationRow, bool]:
            created = await tx.run(self.sql.cancellations.CREATE_CANCELLATION, params) == 1
            row = await tx.one(self.sql.cancellations.CANCELLATION_FOR, params)
            assert row is not None
            return self._rows.cancellation(row), created

        return await self._transact(body)

    async def update_cancellation(
        self,
        cancellation_id: str,
        *,
        status: str,
        steps: list[dict[str, object]],
        result: dict[str, object] | None,
        error: str | None,
        final: bool,
        expect: str | None = None,
    ) -> bool:
        params = {
            "id": cancellation_id,
            "status": status,
            "steps": json.dumps(steps),
            "result": json.dumps(result) if result is not None else None,
            "error": error,
            "final": final,
            "expect": expect,
        }

        async def body(tx: Tx) -> bool:
            row = await tx.one(self.sql.cancellations.UPDATE_CANCELLATION, params)
            if row is None:
                return False
            await tx.notify(h.CHANGED, [str(row["job_id"])])
            return True

        return await self._transact(body)

    async def get_cancellation(
        self, *, job_id: int | None, request_id: str | None
    ) -> CancellationRow | None:
        async def body(tx: Tx) -> CancellationRow | None:
            params = {"job_id": job_id, "request_id": request_id}
            row = await tx.one(self.sql.cancellations.GET_CANCELLATION, params)
            return self._rows.cancellation(row) if row else None

        return await self._query(body)

    async def list_cancellations(
        self, *, limit: int, offset: int, status: str | None = None
    ) -> list[CancellationRow]:
        # Two statements, not one with an OR: the filtered one uses the partial index.
        if status is None:
            query = self.sql.cancellations.LIST_CANCELLATIONS
        else:
            query = self.sql.cancellations.list_cancellations_with_status(status)
        params = {"status": status, "limit": limit, "offset": offset}

        async def body(tx: Tx) -> list[CancellationRow]:
            return [self._rows.cancellation(r) for r in await tx.all(query, params)]

        return await self._query(body)

    async def list_stale_cancellations(
        self, *, older_than: float, limit: int
    ) -> list[CancellationRow]:
        async def body(tx: Tx) -> list[CancellationRow]:
            params = {"older_than": older_than, "limit": limit}
            rows = await tx.all(self.sql.cancellations.LIST_STALE_CANCELLATIONS, params)
            return [self._rows.cancellation(r) for r in rows]

        return await self._query(body)
