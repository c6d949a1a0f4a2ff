"""The lock-holder fixture: rows held by another client while a real worker runs.

Any client may hold any row for as long as it likes. Here a second connection holds
rows for twice the worker's lease, with each kind of row lock, while an in-process
worker runs jobs with a short lease: the worker's own job rows (one per lock mode, at
once), its worker row, and the maintenance leader's row. No lease may be lost (no
second attempt, no "lost its lease"), the jobs whose rows are not held keep finishing
meanwhile, and once the rows are released every job has completed exactly once.
PostgreSQL only: SQLite has no row locks (a held write transaction stops every writer,
which the self-fencing tests cover).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from collections.abc import AsyncIterator

import psycopg
import pytest

import tether
from tests.helpers import eventually, fast_config
from tether import App, AppConfig, JobState, Worker
from tether.config import MaintenanceConfig

pytestmark = pytest.mark.postgres

LEASE = 1.2
HOLD = 2 * LEASE
MODES = ("FOR UPDATE", "FOR SHARE", "FOR KEY SHARE")


@contextlib.asynccontextmanager
async def holding(
    url: str, table: str, ids: list[object], mode: str, key: str = "id"
) -> AsyncIterator[None]:
    """Hold rows of ``table`` in ``mode`` from a connection of its own until exit."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute(f"SELECT 1 FROM {table} WHERE {key} = ANY(%s) {mode}", (ids,))
        try:
            yield
        finally:
            await conn.rollback()


async def _running(worker: Worker) -> list[int]:
    return [job_id for job_id, run in worker.running.items() if not run.finishing]


@pytest.mark.parametrize(
    "target",
    [
        "jobs",
        *(f"worker {m}" for m in MODES),
        "leader FOR UPDATE",
        "schedule FOR UPDATE",
    ],
)
async def test_rows_held_for_twice_the_lease_cost_no_lease_and_hold_up_nothing_else(
    pg_url: str, target: str
) -> None:
    app = App(
        pg_url,
        config=AppConfig(
            wait_poll_interval=0.05,
            maintenance=MaintenanceConfig(leader_ttl=1.0, leader_renew_interval=0.3),
        ),
    )
    runs: collections.Counter[int] = collections.Counter()
    rng = random.Random(22)

    @app.task(max_attempts=3)
    async def work(ctx: tether.JobContext, seconds: float) -> None:
        runs[ctx.id] += 1
        await asyncio.sleep(seconds)

    # A schedule whose ticks go to a queue no worker here serves: its row is there to
    # be held, its jobs stay out of the count.
    @app.periodic(cron="* * * * * *", name="tick", queue="ticks")
    async def tick(ctx: tether.JobContext) -> None: ...

    config = fast_config(
        concurrency=6, lease_duration=LEASE, heartbeat_interval=0.3, self_fence_margin=0.4
    )
    worker = Worker(app, config)
    await worker.start()
    try:
        # Some jobs outlive the lease (their leases must be extended), most are short.
        jobs = [
            await work.enqueue(seconds=rng.choice([0.05, 0.1, 0.2, 1.5 * LEASE])) for _ in range(60)
        ]
        # Jobs that are running right now, and long enough to still be when held.
        await eventually(lambda: _running(worker), timeout=10)
        held_jobs = (await _running(worker))[:3]
        async with contextlib.AsyncExitStack() as stack:
            if target == "jobs":
                for job_id, mode in zip(held_jobs, MODES, strict=False):
                    await stack.enter_async_context(holding(pg_url, "tether_jobs", [job_id], mode))
            elif target.startswith("worker"):
                mode = target.removeprefix("worker ")
                await stack.enter_async_context(
                    holding(pg_url, "tether_workers", [worker.id], mode)
                )
            elif target.startswith("leader"):
                await stack.enter_async_context(
                    holding(pg_url, "tether_leaders", ["maintenance"], "FOR UPDATE", "name")
                )
            else:
                await eventually(lambda: _scheduled(app), timeout=10)
                await stack.enter_async_context(
                    holding(pg_url, "tether_schedules", ["tick"], "FOR UPDATE", "name")
                )
            finished_before = await _succeeded(app)
            await asyncio.sleep(HOLD)  # the hold itself: a duration, not a wait for an event
            finished_during = await _succeeded(app) - finished_before
        assert finished_during > 0, "jobs whose rows were not held stopped moving"
        await eventually(lambda: _all_done(app, len(jobs)), timeout=30)
        for job in jobs:
            got = await app.get(job.id)
            assert got.state is JobState.SUCCEEDED, got
            assert got.attempt == 1, f"job {job.id} ran {got.attempt} attempts ({got.error})"
        assert set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    finally:
        await worker.stop()
        await app.close()


async def _succeeded(app: App) -> int:
    return (await app.jobs.stats())["succeeded"]


async def _scheduled(app: App) -> bool:
    return bool(await (await app.store()).list_schedules())


async def _all_done(app: App, total: int) -> bool:
    return await _succeeded(app) == total
