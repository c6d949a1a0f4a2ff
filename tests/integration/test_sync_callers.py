"""Callers outside a long-lived event loop: ``asyncio.run`` per call, and the sync
wrappers that Flask or Django views use. Neither may leave connections behind."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from tests.conftest import PG_ADMIN_URL
from tether import App, JobContext

CALLS = 100
# The counting itself is not included; a store holds one connection here, and the
# server may take a moment to drop a backend whose client has gone.
BOUND = 3


def _open_connections(url: str) -> int:
    """Connections to the test database: server backends (PostgreSQL), or file
    descriptors on the database file in this process (SQLite)."""
    if url.startswith("postgresql"):
        name = urlsplit(url).path.lstrip("/")
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
            ).fetchone()
            assert row is not None
            return int(row[0])
    path = Path(url.removeprefix("sqlite:///")).resolve()
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target == str(path)
    return count


def _app(url: str) -> App:
    app = App(url)

    @app.task(name="noop")
    async def noop(ctx: JobContext, n: int) -> int:
        return n

    return app


def test_asyncio_run_per_call_leaves_no_connection_open(db_url: str) -> None:
    app = _app(db_url)
    for i in range(CALLS):
        job = asyncio.run(app.enqueue("noop", {"n": i}))
        assert job.args == {"n": i}
        open_now = _open_connections(db_url)
        assert open_now <= BOUND, f"{open_now} connections open after {i + 1} asyncio.run calls"

    async def count() -> int:
        return (await app.jobs.stats())["queued"]

    assert asyncio.run(count()) == CALLS


def test_sync_calls_share_one_store(db_url: str) -> None:
    app = _app(db_url)
    try:
        for i in range(CALLS):
            job = app.enqueue_sync("noop", {"n": i})
            assert app.get_sync(job.id).args == {"n": i}
            open_now = _open_connections(db_url)
            assert open_now <= BOUND, f"{open_now} connections open after {i + 1} sync calls"
    finally:
        app.close_sync()
