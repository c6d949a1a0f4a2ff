"""Real worker processes: crash recovery and no duplicate claims, on both stores."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import eventually, fast_config
from tests.integration.procapp import build_app
from tether import App, JobState, Worker
from tether.job import Outcome

ROOT = Path(__file__).resolve().parents[2]


class Procs:
    """Starts worker processes and makes sure none outlives the test."""

    def __init__(self, url: str, log_dir: Path) -> None:
        self.url = url
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, concurrency: int = 4) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "TETHER_DATABASE_URL": self.url,
            "TETHER_EXEC_LOG": str(self.log_dir),
            "TETHER_CONCURRENCY": str(concurrency),
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.procapp"],
            cwd=ROOT,
            env=env,
            stderr=open(self.log_dir / f"stderr-{len(self.procs)}.log", "wb"),  # noqa: SIM115
        )
        self.procs.append(proc)
        return proc

    def executions(self) -> list[tuple[int, int, int, int]]:
        """Every (job, attempt, lease_token, pid) line the processes logged."""
        rows = []
        for path in self.log_dir.glob("exec-*.log"):
            for line in path.read_text().splitlines():
                job, attempt, token, pid = (int(x) for x in line.split())
                rows.append((job, attempt, token, pid))
        return rows

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def procs(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Procs]:
    monkeypatch.setenv("TETHER_EXEC_LOG", str(tmp_path))  # for in-process workers too
    p = Procs(db_url, tmp_path)
    yield p
    p.kill_all()


async def _state(app: App, job_id: int, state: JobState) -> bool:
    return (await app.get(job_id)).state is state


@pytest.mark.slow
async def test_sigkilled_worker_job_completes_elsewhere_and_old_attempt_cannot_write(
    db_url: str, procs: Procs
) -> None:
    app = build_app(db_url)
    try:
        job = await app.enqueue("hang_once")
        victim = procs.start(concurrency=1)
        running = await eventually(lambda: _running_with_log(app, procs, job.id), timeout=30)
        old_token = running.lease_token
        victim.send_signal(signal.SIGKILL)
        victim.wait()

        rescuer = Worker(app, fast_config())
        await rescuer.start()
        try:
            done = await app.wait(job.id, timeout=30)
        finally:
            await rescuer.stop()
        assert (done.state, done.result, done.attempt) == (JobState.SUCCEEDED, 2, 2)
        assert done.lease_token > old_token
        events = await app.jobs.events(job.id)
        rescue = [e for e in events if e.actor == "rescuer"]
        assert len(rescue) == 1 and rescue[0].reason == "worker dead"

        # The killed attempt's token is stale: every write it could make is refused.
        store = await app.store()
        assert not await store.save_checkpoint(job.id, old_token, '{"late": true}')
        accepted = await store.finish(
            "ghost", [Outcome(job.id, old_token, JobState.SUCCEEDED, result_json="99")]
        )
        assert accepted == set()
        assert (await app.get(job.id)).result == 2
    finally:
        await app.close()


async def _running_with_log(app: App, procs: Procs, job_id: int) -> object:
    job = await app.get(job_id)
    if job.state is JobState.RUNNING and procs.executions():
        return job
    return None


@pytest.mark.slow
async def test_several_worker_processes_never_run_a_job_twice(db_url: str, procs: Procs) -> None:
    n_jobs = 1500 if db_url.startswith("postgresql") else 600
    app = build_app(db_url)
    try:
        await app.admin.migrate()
        workers = [procs.start(concurrency=8) for _ in range(3)]

        async def all_active() -> bool:
            return sum(w.state == "active" for w in await app.admin.workers()) == 3

        # All three are up before the work arrives: a slow start-up must not leave one
        # process to drain it all (sharing is asserted below).
        await eventually(all_active, timeout=60, every=0.05)
        jobs = await app.enqueue_many([("noop", {"n": i}) for i in range(n_jobs)])
        await eventually(lambda: _all_succeeded(app, n_jobs), timeout=120, every=0.2)
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        codes = await asyncio.gather(*(asyncio.to_thread(p.wait, 30) for p in workers))
        assert codes == [0, 0, 0]

        runs = collections.Counter(job for job, _, _, _ in procs.executions())
        assert set(runs) == {j.id for j in jobs}
        assert max(runs.values()) == 1, "a job ran twice"
        pids = {pid for _, _, _, pid in procs.executions()}
        assert len(pids) > 1, "the work should have been shared"
        results = sorted(j.result for j in await app.jobs.list(state="succeeded", limit=n_jobs))
        assert results == list(range(n_jobs))
    finally:
        await app.close()


async def _draining(app: App) -> bool:
    return any(w.state == "draining" for w in await app.admin.workers())


async def _all_succeeded(app: App, n: int) -> bool:
    return (await app.jobs.stats())["succeeded"] == n


@pytest.mark.slow
async def test_sigterm_releases_running_jobs_before_exit(db_url: str, procs: Procs) -> None:
    app = build_app(db_url)
    try:
        job = await app.enqueue("hang_once")
        proc = procs.start(concurrency=1)
        await eventually(lambda: _running_with_log(app, procs, job.id), timeout=30)
        proc.send_signal(signal.SIGTERM)
        await eventually(lambda: _draining(app), timeout=30)
        # The job ignores the first signal (it would get stop_timeout, 5 s here); a
        # second signal releases it at once.
        started = asyncio.get_running_loop().time()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        assert asyncio.get_running_loop().time() - started < 4.0
        released = await app.get(job.id)
        assert (released.state, released.attempt) == (JobState.QUEUED, 0)
    finally:
        await app.close()


@pytest.mark.slow
async def test_sigterm_warns_the_handler_which_checkpoints_and_resumes_unspent(
    db_url: str, procs: Procs
) -> None:
    app = build_app(db_url)
    try:
        job = await app.enqueue("checkpoint_on_stop")
        proc = procs.start(concurrency=1)
        await eventually(lambda: _running_with_log(app, procs, job.id), timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        released = await app.get(job.id)
        saved = {"saved": "after SIGTERM", "cancelled": False}
        assert (released.state, released.checkpoint, released.attempt) == (
            JobState.QUEUED,
            saved,
            0,
        ), "released with the checkpoint saved after SIGTERM, attempt not spent"

        again = Worker(app, fast_config())
        await again.start()
        try:
            done = await app.wait(job.id, timeout=30)
        finally:
            await again.stop()
        assert (done.state, done.result, done.attempt) == (
            JobState.SUCCEEDED,
            {"resumed_from": saved, "attempt": 1},
            1,
        )
    finally:
        await app.close()
