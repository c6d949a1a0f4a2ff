"""Thread handlers that ignore being stopped are abandoned, but their threads run on and
hold the worker's pool (``concurrency + 4`` threads). A worker must not claim thread jobs
it cannot start, must say so, may stop itself for a restart, and hands back a claimed
job whose handler cannot start. On both stores."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY
from typer.testing import CliRunner

from tests.helpers import eventually, fast_config
from tether import App, JobContext, JobState, SyncJobContext, Worker
from tether.cli import cli
from tether.worker import EXIT_RESTART, SPARE_THREADS


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """What hung handler threads wait for; opened at the end so no thread outlives the
    test for long."""
    event = threading.Event()
    yield event
    event.set()


def _register(app: App, gate: threading.Event, started: threading.Semaphore) -> None:
    @app.task(name="hang", max_attempts=1)
    def hang(ctx: SyncJobContext) -> str:
        started.release()
        gate.wait()  # ignores being cancelled
        return "late"

    @app.task(name="quick", max_attempts=1)
    def quick(ctx: SyncJobContext) -> int:
        return ctx.attempt

    @app.task(name="ping", max_attempts=1)
    async def ping(ctx: JobContext) -> str:
        return "pong"


async def _abandon(app: App, started: threading.Semaphore, n: int) -> None:
    """Run ``n`` hanging thread jobs one after the other and force-cancel each: each
    leaves an abandoned thread behind."""
    for _ in range(n):
        job = await app.enqueue("hang")
        assert await asyncio.to_thread(started.acquire, True, 10)
        result = await app.cancel(job.id, force=True, wait=10)
        assert result.outcome == "cancelled"
        assert (await app.get(job.id)).state is JobState.CANCELLED


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_pool_full_of_abandoned_threads_claims_no_thread_jobs_and_says_so(
    app: App, gate: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    started = threading.Semaphore(0)
    _register(app, gate, started)
    abandoned_before = _sample("tether_abandoned_threads")
    full_before = _sample("tether_thread_pool_exhausted")
    worker = Worker(app, fast_config(concurrency=1, claim_batch=1))
    await worker.start()
    try:
        with caplog.at_level(logging.WARNING, logger="tether.worker"):
            await _abandon(app, started, 1 + SPARE_THREADS)  # every pool thread

        waiting = await app.enqueue("quick")  # first in line
        ping = await app.enqueue("ping")
        done = await app.wait(ping.id, timeout=10)
        assert done.result == "pong", "jobs it can start are still claimed"
        untouched = await app.get(waiting.id)
        assert (untouched.state, untouched.attempt) == (JobState.QUEUED, 0), (
            "a thread job it could not start was not claimed"
        )
        assert worker.threads.full
        assert "thread pool exhausted" in caplog.text

        async def reported() -> bool:
            (row,) = [w for w in await app.admin.workers() if w.id == worker.id]
            return row.abandoned_threads == 1 + SPARE_THREADS and row.thread_pool_full

        await eventually(reported)
        shown = await asyncio.to_thread(
            CliRunner().invoke, cli, ["workers", "--database", app.url, "--json"]
        )
        assert shown.exit_code == 0, shown.output
        (listed,) = json.loads(shown.output)
        assert (listed["abandoned_threads"], listed["thread_pool_full"]) == (5, True)
        assert _sample("tether_abandoned_threads") == abandoned_before + 1 + SPARE_THREADS
        assert _sample("tether_thread_pool_exhausted") == full_before + 1

        gate.set()  # the hung threads end: the pool has room again
        done = await app.wait(waiting.id, timeout=10)
        assert (done.state, done.result) == (JobState.SUCCEEDED, 1)

        async def recovered() -> bool:
            (row,) = [w for w in await app.admin.workers() if w.id == worker.id]
            return row.abandoned_threads == 0 and not row.thread_pool_full

        await eventually(recovered)
        assert _sample("tether_abandoned_threads") == abandoned_before
        assert _sample("tether_thread_pool_exhausted") == full_before
    finally:
        gate.set()
        await worker.stop()


async def test_worker_stops_for_a_restart_past_max_abandoned_threads(
    app: App, gate: threading.Event
) -> None:
    started = threading.Semaphore(0)
    _register(app, gate, started)
    worker = Worker(app, fast_config(concurrency=1, max_abandoned_threads=1))
    running = asyncio.create_task(worker.run())
    try:
        await _abandon(app, started, 1)
        assert not running.done() and worker.exit_code == 0, "one is within the limit"
        await _abandon(app, started, 1)
        await asyncio.wait_for(running, 30)  # stopped by itself, gracefully
        assert worker.exit_code == EXIT_RESTART
        (row,) = [w for w in await app.admin.workers() if w.id == worker.id]
        assert (row.state, row.abandoned_threads) == ("stopped", 2)
    finally:
        gate.set()
        await worker.stop()


async def test_claimed_job_whose_handler_cannot_start_goes_back_unstarted(
    app: App, gate: threading.Event
) -> None:
    started = threading.Semaphore(0)
    _register(app, gate, started)
    worker = Worker(app, fast_config(concurrency=1, handler_start_timeout=0.5))
    await worker.start()
    try:
        # Something else holds every pool thread (the worker does not know of it).
        for _ in range(worker.threads.size):
            worker.threads.pool.submit(gate.wait)
        job = await app.enqueue("quick")

        async def handed_back() -> bool:
            events = await app.jobs.events(job.id)
            return any(
                e.to_state is JobState.QUEUED
                and (e.reason or "").startswith("handed back unstarted")
                for e in events
            )

        await eventually(handed_back)
        gate.set()
        done = await app.wait(job.id, timeout=10)
        assert (done.state, done.result, done.attempt) == (JobState.SUCCEEDED, 1, 1), (
            "the attempts handed back were not spent"
        )
    finally:
        gate.set()
        await worker.stop()
