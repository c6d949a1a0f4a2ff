"""The :class:`~tether.store.driver.Tx` of a psycopg connection."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from psycopg.rows import tuple_row

from tether import hints as h
from tether.store.driver import Params, Row

CHANNELS = {
    "tether_enqueued": h.ENQUEUED,
    "tether_control": h.CONTROL,
    "tether_cancel": h.CANCEL,
    "tether_changed": h.CHANGED,
}
SERVER_CHANNELS = {hint: channel for channel, hint in CHANNELS.items()}
NOTIFY_MAX = 7000  # bytes per payload, under PostgreSQL's 8000


def chunks(ids: Sequence[str]) -> list[str]:
    """Comma-joined payloads that each fit in one NOTIFY."""
    out, cur = [], ""
    for i in ids:
        if cur and len(cur) + len(i) + 1 > NOTIFY_MAX:
            out.append(cur)
            cur = ""
        cur = f"{cur},{i}" if cur else i
    if cur:
        out.append(cur)
    return out


class PostgresTx:
    """Statements on a psycopg connection (dict rows), or on what stands for one."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def all(self, query: str, params: Params | None = None) -> list[Row]:
        cur = await self._conn.execute(query, params)
        rows: list[Row] = await cur.fetchall()
        return rows

    async def one(self, query: str, params: Params | None = None) -> Row | None:
        cur = await self._conn.execute(query, params)
        row: Row | None = await cur.fetchone()
        return row

    async def tuples(self, query: str, params: Params | None = None) -> list[tuple[Any, ...]]:
        cur = self._conn.cursor(row_factory=tuple_row)
        await cur.execute(query, params)
        rows: list[tuple[Any, ...]] = await cur.fetchall()
        return rows

    async def run(self, query: str, params: Params | None = None) -> int:
        cur = await self._conn.execute(query, params)
        count: int = cur.rowcount
        return count

    async def notify(self, hint: str, keys: Iterable[str]) -> None:
        # Delivered at commit to every listening process, this one included.
        for payload in chunks(sorted(keys)):
            await self._conn.execute("SELECT pg_notify(%s, %s)", (SERVER_CHANNELS[hint], payload))
