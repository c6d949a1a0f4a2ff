"""Helpers for the control-plane integration tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import tether
from tests.helpers import fast_config
from tether import App, CancellationResult, Worker
from tether.maintenance.rescuer import Rescuer

StartWorker = Callable[..., Awaitable[Worker]]
"""The ``workers`` fixture: ``await workers(services=True, **fast_config overrides)``."""


def assert_one_runner(result: CancellationResult, worker: Worker | str, how: str) -> None:
    """The cancellation stopped exactly one runner, on ``worker`` (or that worker id), by
    ``how``."""
    worker_id = worker if isinstance(worker, str) else worker.id
    (runner,) = result.runners_terminated
    assert worker_id in runner and runner.endswith(f"({how})"), runner


def artifact_names(preserved: Sequence[str]) -> list[str]:
    """Artifact names from a cancellation's ``artifacts_preserved`` (``job/name``)."""
    return [entry.rsplit("/", 1)[-1] for entry in preserved]


@contextlib.asynccontextmanager
async def rescued_job(app: App, name: str) -> AsyncIterator[tether.Job]:
    """A job of a task ``name`` that runs until stopped, claimed by a worker that is
    then marked dead and rescued by a rescuer running ``app``'s hooks; the job as
    rescued. The worker is stopped on exit."""
    started = asyncio.Event()

    @app.task(name=name, max_attempts=3)
    async def victim(ctx: tether.JobContext) -> None:
        started.set()
        await asyncio.Event().wait()

    worker = Worker(app, fast_config())
    await worker.start(services=False)
    try:
        job = await victim.enqueue()
        assert await worker.claimer.run_once() == 1
        await asyncio.wait_for(started.wait(), 10)
        store = await app.store()
        await store.set_worker_state(worker.id, "dead")
        rescuer = Rescuer(store, interval=1.0, session_grace=1.0, hooks=app.hooks)
        (rescued,) = await rescuer.run_once()
        assert rescued.id == job.id
        yield rescued
    finally:
        await worker.stop()
