"""Server connections (PostgreSQL): every session says whose it is in
``pg_stat_activity``, so an operator can count a worker's connections."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import psycopg
import pytest

from tests.helpers import eventually, fast_config
from tether import App, AppConfig, JobContext, JobState, Worker
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


def _named(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


async def _backends(url: str, name: str) -> int:
    """The server's sessions named ``name`` (the pool's and the LISTEN one)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _started(worker: Worker) -> tuple[PostgresStore, Any]:
    """Start ``worker`` with its loops left to the test (run_once); its store and pool."""
    await worker.start(services=False)
    store = worker.store
    assert isinstance(store, PostgresStore)
    return store, store._pool


async def test_an_idle_worker_keeps_one_pooled_connection_and_widens_when_jobs_arrive(
    pg_url: str,
) -> None:
    name = "narrowing"
    app = App(_named(pg_url, name), config=AppConfig(wait_poll_interval=0.05))
    release = asyncio.Event()

    @app.task
    async def hold(ctx: JobContext) -> None:
        await release.wait()

    worker = Worker(app, fast_config())
    try:
        # The loops are driven by hand (run_once), so no call overlaps unless the test
        # makes it.
        store, pool = await _started(worker)
        async with store._conn():
            await store.list_queues()  # two calls at once: a second connection
        assert pool.get_stats()["pool_size"] == 2

        # Nothing to claim and nothing held: idle. The idle connection beyond the one
        # closes at once, not after max_idle.
        assert await worker.claimer.run_once() == 0
        stats = pool.get_stats()
        assert (stats["pool_max"], stats["pool_size"]) == (1, 1)
        assert await eventually(lambda: _is(_backends(pg_url, name), 2))  # + LISTEN

        # An idle call that overlaps another waits for the one connection.
        async with store._conn():
            later = asyncio.ensure_future(store.list_queues())
            assert await eventually(lambda: _true(pool.get_stats()["requests_waiting"] == 1))
        await later
        assert pool.get_stats()["pool_size"] == 1

        # A claim that finds a job makes the worker busy: overlapping calls open a
        # second connection again.
        job = await hold.enqueue()
        assert await worker.claimer.run_once() == 1
        async with store._conn():
            await store.list_queues()
        stats = pool.get_stats()
        assert (stats["pool_max"], stats["pool_size"]) == (2, 2)

        # Holding a job, a claim that finds nothing leaves the worker busy.
        assert await worker.claimer.run_once() == 0
        assert pool.get_stats()["pool_max"] == 2

        release.set()
        assert (await app.wait(job.id, timeout=10)).state is JobState.SUCCEEDED
        await worker.wait_idle()
        assert await worker.claimer.run_once() == 0
        stats = pool.get_stats()
        assert (stats["pool_max"], stats["pool_size"]) == (1, 1)

        await worker.stop()
        # No worker left: the pool is as opened, for the process's other calls.
        await store.list_queues()
        stats = pool.get_stats()
        assert (stats["pool_min"], stats["pool_max"]) == (1, 2)
    finally:
        await worker.stop()
        await app.close()


async def test_a_connection_in_use_when_the_pool_narrows_closes_as_it_comes_back(
    pg_url: str,
) -> None:
    app = App(pg_url)

    @app.task
    async def nothing(ctx: JobContext) -> None:
        pass

    worker = Worker(app, fast_config())
    try:
        store, pool = await _started(worker)
        async with store._conn() as first, store._conn() as second:
            # Both lent: the narrowing has nothing idle to close yet.
            await store.worker_idle(worker.id, True)
            assert pool.get_stats()["pool_size"] == 2
        assert pool.get_stats()["pool_size"] == 1
        assert first.closed != second.closed
    finally:
        await worker.stop()
        await app.close()


async def _is(count: Awaitable[int], expected: int) -> bool:
    return await count == expected


async def _true(value: bool) -> bool:
    return value
