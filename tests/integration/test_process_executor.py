"""``executor="process"``: handlers in a child process that can always be killed.

The handlers live in ``tests.integration.proc_tasks`` so the spawned child can import
them. The tests where the child dies without reporting (SIGKILL, a crash) run their
worker in a process of its own (``tests.integration.proc_worker``): a worker that
wedges on such a death must fail the test, not hang the test run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.helpers import eventually
from tests.integration.control_support import StartWorker, assert_one_runner
from tests.integration.proc_tasks import register
from tests.integration.proc_worker import build_app
from tether import App, JobState

ROOT = Path(__file__).resolve().parents[2]
# A worker that handles the child's death records the outcome well within this.
SETTLE = 2.5


async def _started(app: App, job_id: int) -> int | None:
    """The child's pid, once the handler has checkpointed it."""
    job = await app.get(job_id)
    checkpoint: Any = job.checkpoint
    return checkpoint["pid"] if isinstance(checkpoint, dict) and "pid" in checkpoint else None


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _in_state(app: App, job_id: int, state: JobState) -> tether.Job | None:
    job = await app.get(job_id)
    return job if job.state is state else None


async def test_cooperative_process_job_stops_on_sigterm(app: App, workers: StartWorker) -> None:
    tasks = register(app, max_attempts=1)
    worker = await workers(kill_timeout=30.0)  # SIGKILL never comes in time
    job = await tasks["cooperative"].enqueue()
    pid = await eventually(lambda: _started(app, job.id), timeout=30)
    result = await app.cancel(job.id, wait=10)
    assert (result.status, result.outcome) == ("completed", "cancelled")
    assert_one_runner(result, worker, "sigterm")
    assert (result.job.state, result.job.stopped_by) == (JobState.CANCELLED, "sigterm")
    assert _gone(pid)


async def test_a_sigterm_its_worker_did_not_send_leaves_a_process_job_running(
    app: App, workers: StartWorker, tmp_path: Path
) -> None:
    tasks = register(app, max_attempts=1)
    await workers()
    release = tmp_path / "release"
    job = await tasks["until_file"].enqueue(path=str(release))
    pid = await eventually(lambda: _started(app, job.id), timeout=30)
    # As systemd (KillMode=control-group) or a terminal's Ctrl-C signal the whole group:
    # the worker decides what becomes of its jobs, not the signal.
    os.kill(pid, signal.SIGTERM)
    rounds = tmp_path / "release.rounds"

    def counted() -> int:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int(rounds.read_text())
        return 0

    after = counted()

    async def looped_since() -> bool:  # so it has checked for cancellation since
        return counted() >= after + 2

    await eventually(looped_since, timeout=30)
    release.touch()
    done = await eventually(lambda: _in_state(app, job.id, JobState.SUCCEEDED), timeout=30)
    assert done.result == "done"


async def test_process_job_checkpoints_reports_progress_and_returns_a_result(
    app: App, workers: StartWorker
) -> None:
    tasks = register(app, max_attempts=1)
    await workers()
    job = await tasks["add_with_checkpoint"].enqueue(a=2, b=40)
    done = await app.wait(job.id, timeout=30)
    assert done.state is JobState.SUCCEEDED
    assert done.result == {
        "sum": 42,
        "checkpoint_before": None,
        "checkpoint_after": {"partial": 2},
    }
    assert done.checkpoint == {"partial": 2}
    assert done.attempt == 1


async def test_process_job_over_its_budget_is_paused(app: App, workers: StartWorker) -> None:
    tasks = register(app, max_attempts=1)
    await workers(kill_timeout=30.0)
    job = await tasks["spend"].options(budget=10).enqueue(per_step=4)
    paused = await eventually(lambda: _in_state(app, job.id, JobState.PAUSED), timeout=30)
    assert paused.pause_reason is not None
    assert paused.pause_reason.startswith("budget exceeded"), paused.pause_reason
    assert paused.usage > 10
    assert (paused.stopped_by, paused.attempt) == ("sigterm", 0)


async def test_process_handler_context_knows_its_job_id_and_attempt(
    app: App, workers: StartWorker
) -> None:
    tasks = register(app, max_attempts=1)
    await workers()
    job = await tasks["whoami"].enqueue()
    done = await app.wait(job.id, timeout=30)
    assert done.state is JobState.SUCCEEDED
    assert done.result == {"id": job.id, "attempt": 1}


async def test_a_process_handler_asking_for_a_durable_step_gets_a_clear_error(
    app: App, workers: StartWorker
) -> None:
    tasks = register(app, max_attempts=1)
    await workers()
    job = await tasks["wants_steps"].enqueue()
    done = await app.wait(job.id, timeout=30)
    assert done.result.startswith("InvalidJobError: ctx.step() is not available")


async def test_process_handler_sees_pause_as_the_reason_when_paused(
    app: App, workers: StartWorker
) -> None:
    tasks = register(app, max_attempts=1)
    await workers(kill_timeout=30.0)
    job = await tasks["note_reason"].enqueue()
    await eventually(lambda: _started(app, job.id), timeout=30)
    await app.jobs.pause(job.id)
    paused = await eventually(lambda: _in_state(app, job.id, JobState.PAUSED), timeout=30)
    assert paused.stopped_by == "sigterm"
    assert paused.checkpoint == {"reason": "pause"}


# -- the child dies without reporting: the worker runs in a process of its own ----------


@pytest.fixture
def proc_worker(db_url: str, tmp_path: Path) -> Iterator[Callable[..., None]]:
    """``proc_worker(kill_timeout=...)`` starts a ``proc_worker`` process; it is killed
    (and any job child it left) at the end of the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(kill_timeout: float = 1.0) -> None:
        env = {
            **os.environ,
            "TETHER_DATABASE_URL": db_url,
            "TETHER_KILL_TIMEOUT": str(kill_timeout),
        }
        with open(tmp_path / f"proc_worker-{len(procs)}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.integration.proc_worker"],
                    cwd=ROOT,
                    env=env,
                    stderr=log,
                )
            )

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _kill_quietly(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_process_job_ignoring_sigterm_is_sigkilled_after_kill_timeout(
    db_url: str, proc_worker: Callable[..., None]
) -> None:
    app = build_app(db_url)
    pid = None
    try:
        job = await app.enqueue("proc.ignore_sigterm")
        proc_worker(kill_timeout=0.5)
        pid = await eventually(lambda: _started(app, job.id), timeout=30)
        result = await app.cancel(job.id, reason="stop", wait=SETTLE)
        assert (result.status, result.outcome) == ("completed", "cancelled"), result.errors
        worker_id = (await app.get(job.id)).worker_id
        assert worker_id is not None
        assert_one_runner(result, worker_id, "sigkill")
        assert (result.job.state, result.job.stopped_by) == (JobState.CANCELLED, "sigkill")
        assert result.job.error == "cancelled while running (stopped: sigkill)"
        assert _gone(pid), "the child process is dead"
    finally:
        _kill_quietly(pid)
        await app.close()


async def test_force_cancel_kills_a_process_job_at_once(
    db_url: str, proc_worker: Callable[..., None]
) -> None:
    app = build_app(db_url)
    pid = None
    try:
        job = await app.enqueue("proc.ignore_sigterm")
        proc_worker(kill_timeout=30.0)  # without force, SIGKILL would come after 30 s
        pid = await eventually(lambda: _started(app, job.id), timeout=30)
        result = await app.cancel(job.id, force=True, wait=SETTLE)
        assert (result.status, result.outcome) == ("completed", "cancelled"), result.errors
        assert (result.job.state, result.job.stopped_by, result.job.cancel_force) == (
            JobState.CANCELLED,
            "sigkill",
            True,
        )
        record = await app.cancellations.get(job.id)
        assert record is not None and record.force is True
        assert _gone(pid)
    finally:
        _kill_quietly(pid)
        await app.close()


async def test_crash_of_the_child_process_fails_the_attempt_with_a_clear_error(
    db_url: str, proc_worker: Callable[..., None]
) -> None:
    app = build_app(db_url)
    try:
        job = await app.enqueue("proc.crash")
        proc_worker()
        await eventually(lambda: _started(app, job.id), timeout=30)
        done = await app.wait(job.id, timeout=SETTLE)
        assert done.state is JobState.FAILED
        assert done.error is not None and "job process ended by exit code 3" in done.error
        assert done.attempt == 1
        reason = (await app.jobs.events(done.id))[-1].reason
        assert reason is not None and reason.startswith("max retries exceeded (0)")
    finally:
        await app.close()


async def test_child_that_loses_its_pipe_then_dies_fails_the_attempt(
    db_url: str, proc_worker: Callable[..., None]
) -> None:
    app = build_app(db_url)
    try:
        job = await app.enqueue("proc.lose_pipe_then_crash")
        proc_worker()
        await eventually(lambda: _started(app, job.id), timeout=30)
        done = await app.wait(job.id, timeout=SETTLE)
        assert done.state is JobState.FAILED
        assert done.error is not None and "job process ended by exit code 3" in done.error
    finally:
        await app.close()
