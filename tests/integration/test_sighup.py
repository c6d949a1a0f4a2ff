"""SIGHUP (a closed terminal, a supervisor's reload) stops a real ``tether worker``
gracefully, as SIGTERM does: exit 0, its row ``stopped``, its running job handed back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import tether
from tether import App, JobState

TETHER = str(Path(sys.executable).with_name("tether"))
EXIT_BOUND = 30.0

APP_SOURCE = """
import asyncio
from tether import App

app = App({url!r})


@app.task(name="nap")
async def nap(ctx, seconds):
    await asyncio.sleep(seconds)
"""


def start_worker(cwd: Path) -> subprocess.Popen[str]:
    """A real ``tether worker`` of ``jobs:app`` in ``cwd``."""
    return subprocess.Popen(
        [TETHER, "worker", "--app", "jobs:app", "--stop-timeout", "1"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # The worker runs the tether under test, wherever it was imported from.
        env={**os.environ, "PYTHONPATH": str(Path(tether.__file__).parents[1])},
    )


async def test_sighup_stops_a_worker_gracefully(db_url: str, tmp_path: Path) -> None:
    app = App(db_url)
    try:

        @app.task(name="nap")
        async def nap(ctx: object, seconds: float) -> None:
            return None

        job = await app.enqueue(nap, {"seconds": 600})
        (tmp_path / "jobs.py").write_text(APP_SOURCE.format(url=db_url))
        proc = start_worker(tmp_path)
        try:
            # Wait (bounded) until the worker holds the job, so the stop has work to hand back.
            async with asyncio.timeout(EXIT_BOUND):
                while (await app.get(job.id)).state is not JobState.RUNNING:
                    assert proc.poll() is None, proc.communicate()[1]
                    await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGHUP)
            _, err = await asyncio.to_thread(proc.communicate, timeout=EXIT_BOUND)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        [row] = [w for w in await app.admin.workers() if w.pid == proc.pid]
        assert row.state == "stopped"
        # Graceful: the job it held goes back to the queue instead of staying running.
        assert (await app.get(job.id)).state is not JobState.RUNNING
    finally:
        await app.close()
