"""A graceful opening: orphans first, checkpointed work first, a gradual start; and
error backoff while the database is gone."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest

import tether
from tests.helpers import eventually, fast_config
from tests.pgcluster import PrivateCluster
from tether import App, JobState, Worker
from tether.config import LoopBackoff
from tether.procinfo import hostname


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def orphan(app: App, *ids: int) -> None:
    """Lease jobs to a worker whose process is gone, as a crash would leave them."""
    store = await app.store()
    await store.register_worker("ghost", None, hostname(), dead_pid(), None, ["default"], 9)
    for _ in ids:
        await store.claim("ghost", ["default"], sorted(app.tasks), 1, 600)


async def test_worker_recovers_orphans_before_it_claims(app: App) -> None:
    @app.task(name="work")
    async def work(ctx: tether.JobContext) -> None:
        return None

    job = await work.enqueue()
    await orphan(app, job.id)
    worker = Worker(app, fast_config())
    await worker.start(services=False)
    try:
        recovered = await app.get(job.id)
        assert recovered.state is JobState.RETRYING
        assert recovered.attempt == 1, "the crash counts as an attempt"
        assert (await app.jobs.events(job.id))[-1].reason == "worker dead"
    finally:
        await worker.stop()


async def test_recovered_jobs_with_a_checkpoint_run_first(app: App) -> None:
    @app.task(name="work")
    async def work(ctx: tether.JobContext) -> None:
        return None

    plain, resumable = await work.enqueue(), await work.enqueue()
    await orphan(app, plain.id, resumable.id)
    store = await app.store()
    token = (await app.get(resumable.id)).lease_token
    assert await store.save_checkpoint(resumable.id, token, '{"page": 7}')
    newer = await work.enqueue()

    worker = Worker(app, fast_config(concurrency=1, claim_batch=1))
    await worker.start(services=False)
    try:
        order = []
        for _ in range(3):
            assert await worker.claimer.run_once() == 1
            order.append(next(iter(worker.running)))
            await worker.wait_idle()
        assert order == [resumable.id, newer.id, plain.id]
    finally:
        await worker.stop()


async def test_gradual_start_lets_the_first_job_start_at_once_and_holds_the_rest(
    app: App,
) -> None:
    release = asyncio.Event()

    @app.task(name="work")
    async def work(ctx: tether.JobContext) -> None:
        await release.wait()

    await app.enqueue_many([(work, {}) for _ in range(20)])
    worker = Worker(app, fast_config(concurrency=20, ramp_window=60, ramp_warm_interval=30))
    await worker.start(services=False)
    try:
        assert await worker.claimer.run_once() == 1
        assert await worker.claimer.run_once() == 0, "job 2 waits for the warm phase"
        assert len(worker.running) == 1
    finally:
        release.set()
        await worker.stop()


@pytest.mark.slow
async def test_claim_loop_backs_off_while_postgres_is_stopped_and_recovers(
    private_pg: PrivateCluster, private_pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A private cluster: stopping a shared server would break everyone else using it.
    app = App(private_pg_url)

    @app.task(name="work")
    async def work(ctx: tether.JobContext) -> str:
        return "done"

    worker = Worker(app, fast_config(poll_interval=0.05, backoff=LoopBackoff(2, 0.8)))
    await worker.start()
    try:
        with caplog.at_level(logging.INFO, logger="tether"):
            await asyncio.to_thread(private_pg.stop)
            await eventually(lambda: _backed_off(worker), timeout=60, every=0.1)
            failures = worker.claimer.errors
            await asyncio.to_thread(private_pg.start)
            await eventually(lambda: _recovered(worker), timeout=60, every=0.1)
        claim_lines = [r for r in caplog.records if "claimer failed" in r.getMessage()]
        assert failures >= 3
        assert 1 <= len(claim_lines) <= 2, "the outage must not flood the log"
        assert any("claimer recovered" in r.getMessage() for r in caplog.records)
        job = await work.enqueue()
        assert (await app.wait(job.id, timeout=30)).result == "done"
    finally:
        await asyncio.to_thread(private_pg.ensure_started)
        await worker.stop()
        await app.close()


async def _backed_off(worker: Worker) -> bool:
    return worker.claimer.errors >= 3 and worker.claimer.delay() == 0.8


async def _recovered(worker: Worker) -> bool:
    return worker.claimer.errors == 0
