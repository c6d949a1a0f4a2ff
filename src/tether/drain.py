"""Running every due job in-process until none is left: for tests, scripts and examples.

This is an ordinary worker whose claimer is driven by hand (``run_once()``), so jobs go
through the real state machine: claims, leases, outcomes, retries and workflows all
behave as they do under ``tether worker``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tether.config import WorkerConfig
from tether.job import Job

if TYPE_CHECKING:
    from tether.app import App


async def run_until_idle(
    app: App, *, queues: tuple[str, ...] | None = None, timeout: float | None = None
) -> list[Job]:
    """Run every due job of ``queues`` (default: every queue of the app's tasks), and
    the jobs they make due (children, dependents, immediate retries), until none is left.

    Returns each job that ran, as it stands afterwards, in the order first claimed. A
    job retrying later, or waiting on something else, is left for later. ``timeout``
    bounds the whole run; :class:`TimeoutError` when it passes.
    """
    if not app.tasks:
        return []
    wanted = queues or tuple(sorted({t.queue for t in app.tasks.values()}))
    worker = app.worker(WorkerConfig(queues=wanted))
    ran: dict[int, None] = {}
    async with asyncio.timeout(timeout):
        await worker.start(services=False)
        try:
            while True:
                got = await worker.claimer.run_once()
                # Claimed jobs are in ``running`` until their outcome is written.
                ran.update(dict.fromkeys(worker.running))
                if not got and not worker.running:
                    break
                await worker.wait_idle(timeout=float("inf"))
        finally:
            await worker.stop()
    return [await app.get(job_id) for job_id in ran]
