"""A step of the clock that judges leases rescues no live worker's job.

Leases are stamped by one clock: the PostgreSQL server's, or on SQLite each process's
own. When it steps (NTP after a VM resumes), every lease can look expired at once. The
rescue judges liveness by heartbeats arriving instead: a job is rescued only once its
worker's beat counter stood still for a lease on the rescuer's monotonic clock. Here
clocks step for real, under libfaketime (the monotonic clock stays real):

- SQLite: two worker processes, one stepped 120 s ahead and one 120 s behind while
  they run jobs that outlive their lease;
- PostgreSQL: a private server whose clock steps 120 s ahead while two workers run.

No job may run twice, and no job may be rescued.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import IN_CI
from tests.helpers import eventually, fast_config
from tests.integration.procapp import build_app
from tests.pgcluster import PrivateCluster, bindir
from tether import App, JobState, Worker

ROOT = Path(__file__).resolve().parents[2]
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
STEP = 120
JOBS = 16
SECONDS = 2.5  # each job outlives its 1.5 s lease: it needs its lease extended

pytestmark = pytest.mark.skipif(
    not LIBFAKETIME.exists() and not IN_CI, reason="libfaketime is not installed"
)


def faked(clock: Path) -> dict[str, str]:
    """An environment whose wall clock is this file's offset ("+120", "-120"), read at
    every call, with the monotonic clock left real."""
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        "FAKETIME_NO_CACHE": "1",
        "DONT_FAKE_MONOTONIC": "1",  # libfaketime < 0.9.9
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        # Without this, libfaketime's rewrite of pthread_cond_timedwait stalls Python's
        # threads (the GIL's waits) for seconds, and workers fence for no reason.
        "FAKETIME_FORCE_MONOTONIC_FIX": "0",
    }


def step(clock: Path, offset: int) -> None:
    """Set the offset at once (a rename: no reader ever sees half a file)."""
    new = clock.with_suffix(".new")
    new.write_text(f"{offset:+d}\n")
    new.chmod(0o644)
    new.replace(clock)


def executions(log_dir: Path) -> collections.Counter[int]:
    """How many times each job started (every attempt logs a line first)."""
    runs: collections.Counter[int] = collections.Counter()
    for path in log_dir.glob("exec-*.log"):
        for line in path.read_text().splitlines():
            runs[int(line.split()[0])] += 1
    return runs


async def rescued(app: App, ids: list[int]) -> list[tuple[int, str | None]]:
    """The jobs rescued, with why."""
    store = await app.store()
    return [(i, e.reason) for i in ids for e in await store.events(i) if e.actor == "rescuer"]


async def _running(app: App, n: int) -> bool:
    return (await app.jobs.stats())["running"] >= n


async def _all_succeeded(app: App, n: int) -> bool:
    return (await app.jobs.stats())["succeeded"] == n


def start_worker(url: str, log_dir: Path, clock: Path, n: int) -> subprocess.Popen[bytes]:
    """A worker process (tests.integration.procapp) whose wall clock is ``clock``'s."""
    env = {
        **os.environ,
        **faked(clock),
        "TETHER_DATABASE_URL": url,
        "TETHER_EXEC_LOG": str(log_dir),
        "TETHER_CONCURRENCY": "4",
    }
    with (log_dir / f"stderr-{n}.log").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.procapp"], cwd=ROOT, env=env, stderr=err
        )


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_sqlite_workers_whose_clocks_step_apart_run_each_job_once(
    sqlite_url: str, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    app = build_app(sqlite_url)
    try:
        sleepy = app.tasks["sleepy"]
        ids = [(await sleepy.enqueue(seconds=SECONDS)).id for _ in range(JOBS)]
        clocks = [tmp_path / "ahead.clock", tmp_path / "behind.clock"]
        for i, clock in enumerate(clocks):
            step(clock, 0)
            processes.append(start_worker(sqlite_url, tmp_path, clock, i))
        await eventually(lambda: _running(app, 8), timeout=30)
        step(clocks[0], +STEP)  # mid-run: one process jumps ahead, the other behind
        step(clocks[1], -STEP)
        await eventually(lambda: _all_succeeded(app, JOBS), timeout=60)
        runs = executions(tmp_path)
        lost = await rescued(app, ids)
        twice = {i: runs[i] for i in ids if runs[i] != 1}
        assert (lost, twice) == ([], {}), f"{sum(runs.values())} executions for {JOBS} jobs"
    finally:
        await app.close()


@pytest.fixture
def stepped_pg(tmp_path: Path) -> Iterator[tuple[PrivateCluster, Path]]:
    """A private PostgreSQL server whose clock (and only its clock) we step."""
    found = bindir()
    if found is None:
        if IN_CI:
            pytest.fail("CI needs PostgreSQL's initdb and pg_ctl for a private cluster")
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed")
    cluster = PrivateCluster(found)
    clock = cluster.root / "server.clock"
    step(clock, 0)
    try:
        cluster.init()
        cluster.env = {**os.environ, **faked(clock)}
        cluster.start()
        yield cluster, clock
    finally:
        cluster.destroy()


async def test_a_postgresql_server_clock_step_rescues_no_live_job(
    stepped_pg: tuple[PrivateCluster, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, clock = stepped_pg
    with psycopg.connect(cluster.admin_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE stepped")
    url = cluster.admin_url.rsplit("/", 1)[0] + "/stepped"
    monkeypatch.setenv("TETHER_EXEC_LOG", str(tmp_path))
    app = build_app(url)
    workers = [Worker(app, fast_config(concurrency=4, claim_batch=4)) for _ in range(2)]
    try:
        sleepy = app.tasks["sleepy"]
        ids = [(await sleepy.enqueue(seconds=SECONDS)).id for _ in range(JOBS)]
        for worker in workers:
            await worker.start()
        await eventually(lambda: _running(app, 8), timeout=30)
        before = await _server_now(url)
        step(clock, +STEP)
        assert (await _server_now(url)) - before > STEP - 10  # the server's clock stepped
        await eventually(lambda: _all_succeeded(app, JOBS), timeout=60)
        runs = executions(tmp_path)
        lost = await rescued(app, ids)
        twice = {i: runs[i] for i in ids if runs[i] != 1}
        assert (lost, twice) == ([], {}), f"{sum(runs.values())} executions for {JOBS} jobs"
        for i in ids:
            assert (await app.get(i)).state is JobState.SUCCEEDED
    finally:
        for worker in workers:
            await worker.stop()
        await app.close()


async def _server_now(url: str) -> float:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        row = await cur.fetchone()
        assert row is not None
        return float(row[0])
