"""A worker that cannot write its heartbeat stops its own jobs before the lease ends."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg

import tether
from tests.helpers import eventually, fast_config
from tether import App, JobState, Worker
from tether.store import parse_sqlite_path


@asynccontextmanager
async def heartbeats_blocked(url: str) -> AsyncIterator[None]:
    """Hold a lock that makes every heartbeat write wait: a real stall, not a mock."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(parse_sqlite_path(url), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
    else:
        async with await psycopg.AsyncConnection.connect(url) as aconn:
            await aconn.execute("LOCK TABLE tether_workers IN ACCESS EXCLUSIVE MODE")
            try:
                yield
            finally:
                await aconn.rollback()


async def test_worker_fences_itself_before_its_lease_expires(app: App, db_url: str) -> None:
    seen: dict[str, float] = {}
    started = asyncio.Event()

    @app.task(max_attempts=3)
    async def steady(ctx: tether.JobContext) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            seen["at"] = asyncio.get_running_loop().time()
            seen["reason"] = ctx.cancelled.reason or ""
        return "never recorded"

    config = fast_config(lease_duration=4.0, self_fence_margin=1.5, rescue_interval=60)
    worker = Worker(app, config)
    await worker.start()
    job = await steady.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    await worker.heartbeater.run_once()
    try:
        async with heartbeats_blocked(db_url):
            await eventually(lambda: _idle(worker), timeout=15)
            last_ok = worker.heartbeater.last_ok
        assert seen["reason"] == "lease_lost"
        assert seen["at"] - last_ok < config.lease_duration, "stopped after the lease ran out"
        # Nothing was recorded: the job still shows the old lease until it is rescued.
        assert (await app.get(job.id)).state is JobState.RUNNING
    finally:
        await worker.stop()


async def _idle(worker: Worker) -> bool:
    return not worker.running
