"""Real ``tether worker`` processes, each sent one SIGTERM at a random moment of its life.

Moments: at random while Python still imports and the worker opens its app, just
before ``run()`` starts the worker (registering, recovering orphans), right as its
metrics endpoint first answers (before the worker has started), and once it runs jobs.
Every process must end by itself within a bound after that single signal:
with exit code 0 and its worker row ``stopped``, or, if the signal came before any
handler could exist (the interpreter still importing), killed by it with nothing
registered. In the end no job is left running. TETHER_STOP_RUNS sets the runs per store.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.web.support import free_port
from tether import App

TETHER = str(Path(sys.executable).with_name("tether"))
RUNS = int(os.environ.get("TETHER_STOP_RUNS", "16"))
AT_ONCE = 4
#: How long a worker may take to exit after its signal (its stop_timeout is 2 s).
EXIT_BOUND = 30.0

APP_SOURCE = """
import asyncio
from tether import App

app = App({url!r})


@app.task(name="nap")
async def nap(ctx, seconds):
    await asyncio.sleep(seconds)
"""


#: The log lines some moments wait for: the last before run() starts the worker, and
#: the worker's start.
MARKERS = {"starting": "tether.cli: database ", "started": " started: queues="}


@dataclass
class Run:
    moment: str
    pid: int
    returncode: int | None
    stderr: str


def one_worker(cwd: Path, moment: str, delay: float) -> Run:
    """Start a worker, send it SIGTERM at ``moment`` (plus ``delay``), wait for its end."""
    port = free_port()
    proc = subprocess.Popen(
        [
            TETHER,
            "worker",
            "--app",
            "jobs:app",
            "--concurrency",
            "4",
            "--stop-timeout",
            "2",
            "--metrics-port",
            str(port),
        ],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        if moment == "metrics":
            deadline = time.monotonic() + EXIT_BOUND
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)
                    break
                except httpx.TransportError:
                    time.sleep(0.005)
        elif moment in MARKERS:
            for line in proc.stderr:
                seen.append(line)
                if MARKERS[moment] in line:
                    break
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=EXIT_BOUND)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None  # still running: one signal was not enough
    finally:
        if proc.poll() is None:
            proc.kill()
            _, err = proc.communicate()
    return Run(f"{moment} +{delay:.3f}s", proc.pid, code, ("".join(seen) + err)[-3000:])


@pytest.mark.slow
async def test_one_sigterm_stops_a_worker_gracefully_at_any_moment(
    db_url: str, tmp_path: Path
) -> None:
    app = App(db_url)
    try:

        @app.task(name="nap")
        async def nap(ctx: object, seconds: float) -> None:
            return None

        # Work to hold when the signal comes; made (and the schema with it) up front.
        await app.enqueue_many([(nap, {"seconds": 0.2}) for _ in range(RUNS * 20)])
        (tmp_path / "jobs.py").write_text(APP_SOURCE.format(url=db_url))
        rng = random.Random(os.environ.get("TETHER_STOP_SEED"))
        plan = []
        for i in range(RUNS):
            moment = ("spawn", "starting", "metrics", "started")[i % 4]
            delay = {
                "spawn": rng.uniform(0.0, 3.0),  # importing, opening the app
                "starting": rng.uniform(0.0, 0.05),  # registering, recovering, starting
                "metrics": 0.0,  # the endpoint answers before the worker has started
                "started": rng.uniform(0.0, 0.5),  # claiming and running jobs
            }[moment]
            plan.append((moment, delay))
        with ThreadPoolExecutor(AT_ONCE) as pool:
            runs = list(pool.map(lambda p: one_worker(tmp_path, *p), plan))

        rows = {w.pid: w for w in await app.admin.workers()}
        bad = []
        for run in runs:
            row = rows.get(run.pid)
            if run.returncode == 0 and (row is None or row.state == "stopped"):
                continue
            if run.returncode == -signal.SIGTERM and row is None:
                continue  # killed while importing, before it could register anything
            bad.append((run.moment, run.returncode, row and row.state, run.stderr))
        assert not bad, bad
        assert not await app.jobs.list(state="running"), "a job still runs without its worker"
        for run in runs:
            print(run.moment, run.returncode, rows[run.pid].state if run.pid in rows else "-")
    finally:
        await app.close()


SLOW_APP = """
import os, time
open("importing", "w").close()
deadline = time.monotonic() + 60
while not os.path.exists("release") and time.monotonic() < deadline:
    time.sleep(0.01)
from tether import App

app = App({url!r})


@app.task(name="nap")
async def nap(ctx, seconds):
    pass
"""


def stop_while_loading(cwd: Path) -> tuple[int | None, str]:
    """Start a worker of ``slow:app``, SIGTERM it while the app's module still loads."""
    proc = subprocess.Popen(
        [TETHER, "worker", "--app", "slow:app"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + EXIT_BOUND
        while not (cwd / "importing").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the app never loaded"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=EXIT_BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


@pytest.mark.slow
async def test_sigterm_while_the_app_loads_exits_at_once_without_registering(
    db_url: str, tmp_path: Path
) -> None:
    (tmp_path / "slow.py").write_text(SLOW_APP.format(url=db_url))
    code, err = stop_while_loading(tmp_path)
    assert code == 0, err
    assert "SIGTERM before the worker started: exiting" in err
    app = App(db_url)
    try:
        assert await app.admin.workers() == []
    finally:
        await app.close()
