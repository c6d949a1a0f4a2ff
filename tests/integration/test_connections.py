"""Server connections (PostgreSQL): every session says whose it is in
``pg_stat_activity``, so an operator can count a worker's connections."""

from __future__ import annotations

import pytest

from tether.store.postgres import PostgresStore, session_name

pytestmark = pytest.mark.postgres


async def test_sessions_are_named_after_their_process_unless_the_url_names_them(
    pg_url: str,
) -> None:
    store = PostgresStore(pg_url)
    named = PostgresStore(f"{pg_url}?application_name=mine")
    try:
        for s in (store, named):
            await s.open()
        async with store._conn() as conn:
            cur = await conn.execute("SHOW application_name")
            assert (await cur.fetchone()) == {"application_name": session_name()}
        async with named._conn() as conn:
            cur = await conn.execute("SHOW application_name")
            assert (await cur.fetchone()) == {"application_name": "mine"}
    finally:
        for s in (store, named):
            await s.close()
