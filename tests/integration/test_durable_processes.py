"""Durable steps across a killed worker and a zombie, with worker processes of their own
and execution logs (as the fault suite checks them), on both stores."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.helpers import eventually, fast_config
from tests.integration.procapp import build_app
from tests.integration.test_processes import Procs
from tether import App, Job, JobState, Worker
from tether.store import parse_sqlite_path


@pytest.fixture
def procs(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Procs]:
    monkeypatch.setenv("TETHER_EXEC_LOG", str(tmp_path))  # the in-process rescuer's too
    p = Procs(db_url, tmp_path)
    yield p
    p.kill_all()


def _steps_run(log_dir: Path) -> list[tuple[int, int, str]]:
    """Every (job, attempt, step) the processes logged, in order per process."""
    rows = []
    for path in sorted(log_dir.glob("steps-*.log")):
        for line in path.read_text().splitlines():
            job, attempt, step, _pid = line.split()
            rows.append((int(job), int(attempt), step))
    return rows


def _sql(app: App, statement: str) -> list[tuple[object, ...]]:
    if app.url.startswith("sqlite"):
        with sqlite3.connect(parse_sqlite_path(app.url)) as conn:
            return list(conn.execute(statement).fetchall())
    with psycopg.connect(app.url, autocommit=True) as conn:
        cur = conn.execute(statement)
        return list(cur.fetchall()) if cur.description else []


async def _run_elsewhere(app: App, job_id: int) -> Job:
    """The job, once a worker of this process has rescued it and run it to its end."""
    rescuer = Worker(app, fast_config())
    await rescuer.start()
    try:
        return await app.wait(job_id, timeout=30)
    finally:
        await rescuer.stop()


@pytest.mark.slow
async def test_a_worker_killed_between_steps_3_and_4_leaves_only_4_to_6_to_run(
    db_url: str, procs: Procs, tmp_path: Path
) -> None:
    app = build_app(db_url)
    try:
        job = await app.enqueue("six_steps")
        victim = procs.start(concurrency=1)

        async def three_done() -> bool:
            return len(_steps_run(tmp_path)) == 3

        await eventually(three_done, timeout=30)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        done = await _run_elsewhere(app, job.id)
        assert done.state is JobState.SUCCEEDED and done.result == [1, 2, 3, 4, 5, 6]
        assert done.attempt == 2
        ran = _steps_run(tmp_path)
        assert sorted(ran) == sorted(
            [(job.id, 1, f"s{i}") for i in (1, 2, 3)] + [(job.id, 2, f"s{i}") for i in (4, 5, 6)]
        )
        steps = await app.durable.steps(job.id)
        assert [(s.name, s.attempt) for s in steps] == [
            ("s1", 1),
            ("s2", 1),
            ("s3", 1),
            ("s4", 2),
            ("s5", 2),
            ("s6", 2),
        ]
    finally:
        await app.close()


@pytest.mark.slow
async def test_a_zombies_step_and_fenced_writes_do_not_count(
    db_url: str, procs: Procs, tmp_path: Path
) -> None:
    app = build_app(db_url)
    _sql(app, "CREATE TABLE ledger (job_id BIGINT, attempt INT)")
    try:
        job = await app.enqueue("zombie_effect")
        zombie = procs.start(concurrency=1)

        async def frozen() -> bool:
            return any(step == "frozen" for _, _, step in _steps_run(tmp_path))

        await eventually(frozen, timeout=30)
        zombie.send_signal(signal.SIGSTOP)
        try:
            done = await _run_elsewhere(app, job.id)
        finally:
            zombie.send_signal(signal.SIGCONT)
        assert done.state is JobState.SUCCEEDED and done.result == 2

        async def zombie_over() -> bool:
            # The zombie wakes and ends its attempt: its commit refused, or stopped
            # when it heard its lease was lost. Only then is the ledger final.
            return (job.id, 1, "over") in _steps_run(tmp_path)

        await eventually(zombie_over, timeout=20)
        procs.kill_all()
        assert _sql(app, "SELECT job_id, attempt FROM ledger") == [(job.id, 2)]
        (step,) = await app.durable.steps(job.id)
        assert (step.name, step.attempt, step.result) == ("effect", 2, 2)
        assert (await app.get(job.id)).result == 2
    finally:
        await app.close()
