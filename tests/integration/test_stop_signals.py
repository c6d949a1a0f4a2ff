"""A stop signal is never lost, whenever it arrives during a worker's life.

In-process: SIGTERM sent to ourselves at each point of ``Worker.run``'s start-up, down to
the loop iterations right after ``start()`` returns. The stress test with real
``tether worker`` processes is in ``test_stop_signals_stress.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.helpers import fast_config
from tether import App, Worker


def with_a_task(app: App) -> App:
    @app.task(name="echo")
    async def echo(ctx: object) -> None:
        return None

    return app


class SignalledWhileStarting(Worker):
    """A worker that gets SIGTERM at the end of its start, then lets the loop turn
    ``turns`` times before start() returns: the signal's callback and run()'s next
    step then meet in every order."""

    def __init__(self, app: App, turns: int) -> None:
        super().__init__(with_a_task(app), fast_config())
        self.turns = turns

    async def start(self, *, services: bool = True) -> None:
        await super().start(services=services)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(self.turns):
            await asyncio.sleep(0)


@pytest.mark.parametrize("turns", range(4))
async def test_sigterm_during_start_up_stops_the_worker(app: App, turns: int) -> None:
    worker = SignalledWhileStarting(app, turns)
    running = asyncio.create_task(worker.run(handle_signals=True))
    try:
        await asyncio.wait_for(asyncio.shield(running), 20)
    finally:
        if not running.done():  # the signal was lost: stop it by hand, then fail
            await worker.stop()
            await running
    [row] = [w for w in await app.admin.workers() if w.id == worker.id]
    assert row.state == "stopped"


async def test_sigterm_before_start_up_stops_the_worker_before_it_registers(app: App) -> None:
    worker = Worker(with_a_task(app), fast_config())
    loop = asyncio.get_running_loop()
    heard = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, heard.set)
    os.kill(os.getpid(), signal.SIGTERM)
    await heard.wait()
    worker.request_stop()  # as the CLI's handler does before the loop runs
    await asyncio.wait_for(worker.run(handle_signals=True), 20)
    assert worker.id not in {w.id for w in await app.admin.workers()}
