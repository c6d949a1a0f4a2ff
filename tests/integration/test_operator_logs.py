"""What a worker logs about each job (claim, start, finish, the reason of a cancel or
pause, the signals it sends), about each heartbeat round, and what a canceller logs
about each step of a cancellation."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

import tether
from tests.helpers import eventually, fast_config
from tests.integration.control_support import StartWorker
from tests.integration.proc_tasks import register
from tether import App, Worker
from tether.logs import JsonFormatter, job_fields


def _events(caplog: pytest.LogCaptureFixture, job_id: int) -> dict[str, logging.LogRecord]:
    return {
        r.__dict__["event"]: r
        for r in caplog.records
        if r.name == "tether.worker" and r.__dict__.get("job_id") == job_id
    }


async def test_cancel_and_pause_reasons_reach_the_log_at_info(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tether.worker")
    started = asyncio.Event()

    @app.task(name="stepper")
    async def stepper(ctx: tether.JobContext) -> None:
        started.set()
        await asyncio.sleep(60)

    worker = Worker(app, fast_config())
    await worker.start()
    try:
        job = await stepper.enqueue()
        await asyncio.wait_for(started.wait(), 10)
        await app.cancel(job.id, reason="wrong customer", wait=10)
        asked = await eventually(lambda: _async(_events(caplog, job.id).get("cancel_requested")))
        assert asked.levelno == logging.INFO
        assert "cancel requested: wrong customer" in asked.getMessage()
        ended = await eventually(lambda: _async(_events(caplog, job.id).get("job_finished")))
        assert ended.levelno == logging.INFO
        assert ended.__dict__["state"] == "cancelled"
        assert ended.__dict__["reason"] == "wrong customer"
        assert ended.__dict__["attempt"] == 1 and ended.__dict__["duration"] > 0
        assert "stepper" in ended.getMessage() and "wrong customer" in ended.getMessage()

        started.clear()
        other = await stepper.enqueue()
        await asyncio.wait_for(started.wait(), 10)
        await app.jobs.pause(other.id, reason="vendor outage")
        ended = await eventually(lambda: _async(_events(caplog, other.id).get("job_finished")))
        asked = _events(caplog, other.id)["pause_requested"]
        assert "pause requested: vendor outage" in asked.getMessage()
        assert (ended.__dict__["state"], ended.__dict__["reason"]) == ("paused", "vendor outage")
    finally:
        await worker.stop()


async def _async(value: logging.LogRecord | None) -> logging.LogRecord | None:
    return value


async def test_a_claim_is_logged_at_info_and_each_heartbeat_round_at_debug(
    app: App, workers: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tether.worker")
    started = asyncio.Event()

    @app.task(name="sleeper")
    async def sleeper(ctx: tether.JobContext) -> None:
        started.set()
        await asyncio.sleep(60)

    worker = await workers(services=False)
    job = await sleeper.enqueue()
    assert await worker.claimer.run_once() == 1
    claimed = _events(caplog, job.id)["job_claimed"]
    assert claimed.levelno == logging.INFO
    assert (
        claimed.getMessage() == f"job {job.id} (sleeper) claimed by worker {worker.id}, attempt 1"
    )
    assert (claimed.__dict__["worker_id"], claimed.__dict__["attempt"]) == (worker.id, 1)
    assert (claimed.__dict__["task"], claimed.__dict__["queue"]) == ("sleeper", "default")
    await asyncio.wait_for(started.wait(), 10)

    caplog.clear()
    assert await worker.heartbeater.run_once() == 1
    [beat] = [r for r in caplog.records if r.__dict__.get("event") == "heartbeat"]
    assert beat.levelno == logging.DEBUG
    assert (beat.__dict__["worker_id"], beat.__dict__["leases"], beat.__dict__["lost"]) == (
        worker.id,
        1,
        [],
    )
    assert f"heartbeat of worker {worker.id}: 1 lease(s) extended" == beat.getMessage()

    # With DEBUG off, a round logs nothing.
    caplog.set_level(logging.INFO, logger="tether.worker")
    caplog.clear()
    await worker.heartbeater.run_once()
    assert not [r for r in caplog.records if r.__dict__.get("event") == "heartbeat"]

    # A lease another worker's rescuer took over shows as lost, and the job's stop too.
    caplog.set_level(logging.DEBUG, logger="tether.worker")
    store = await app.store()
    await store.set_worker_state(worker.id, "dead")
    assert [j.id for j in await store.rescue()] == [job.id]
    caplog.clear()
    await worker.heartbeater.run_once()
    [beat] = [r for r in caplog.records if r.__dict__.get("event") == "heartbeat"]
    assert (beat.__dict__["leases"], beat.__dict__["lost"]) == (0, [job.id])
    assert beat.getMessage().endswith(f": 0 lease(s) extended, 1 lost ({job.id})")
    stop = _events(caplog, job.id)["handler_stopped"]
    assert stop.__dict__["interrupt"] == "lease_lost"
    assert stop.getMessage().endswith("its task cancelled (lease_lost)")


async def test_a_cancelled_process_job_logs_each_step_and_the_signal_sent(
    app: App, workers: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tether")
    tasks = register(app, max_attempts=1)
    worker = await workers(kill_timeout=30.0)  # SIGTERM ends it; SIGKILL never comes
    job = await tasks["cooperative"].enqueue()
    await eventually(lambda: _running(app, job.id), timeout=30)
    result = await app.cancel(job.id, reason="wrong customer", wait=10)
    assert (result.status, result.outcome) == ("completed", "cancelled")
    cid = result.cancellation_id

    steps = [
        r
        for r in caplog.records
        if r.name == "tether.cancellation" and r.__dict__.get("cancellation_id") == cid
    ]
    assert [r.__dict__["event"] for r in steps] == [
        "cancellation_initiated",
        *["cancellation_step"] * 4,
        "cancellation_finished",
    ]
    assert [r.__dict__.get("step") for r in steps[1:5]] == [
        "request",
        "stop_runners",
        "update_tasks",
        "clean_resources",
    ]
    assert all(
        (r.__dict__["job_id"], r.__dict__["reason"]) == (job.id, "wrong customer") for r in steps
    )
    assert all(cid in r.getMessage() and "wrong customer" in r.getMessage() for r in steps)
    assert (
        steps[2].__dict__["status"] == "completed" and steps[-1].__dict__["status"] == "completed"
    )

    sent = await eventually(lambda: _async(_events(caplog, job.id).get("signal_sent")))
    assert sent.levelno == logging.INFO
    assert (sent.__dict__["signal"], sent.__dict__["interrupt"]) == ("SIGTERM", "cancel")
    assert sent.__dict__["worker_id"] == worker.id and sent.__dict__["pid"] > 0
    assert f"SIGTERM sent to process {sent.__dict__['pid']} (cancel" in sent.getMessage()
    # (Its reason may not be there: the process can end before the worker read it.)
    ended = await eventually(lambda: _async(_events(caplog, job.id).get("job_finished")))
    assert ended.__dict__["state"] == "cancelled"


async def _running(app: App, job_id: int) -> bool:
    job = await app.get(job_id)
    return job.checkpoint is not None


def test_json_formatter_writes_the_job_fields() -> None:
    record = logging.LogRecord("tether.worker", logging.INFO, __file__, 1, "job %s", (7,), None)
    record.__dict__.update(
        job_fields("job_finished", job_id=7, task="t", attempt=2, duration=0.5, reason=None)
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "job 7" and entry["level"] == "info"
    assert (entry["event"], entry["job_id"], entry["task"], entry["attempt"]) == (
        "job_finished",
        7,
        "t",
        2,
    )
    assert entry["duration"] == 0.5 and "reason" not in entry
    assert entry["time"].endswith("+00:00")
