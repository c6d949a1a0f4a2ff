"""What a worker logs about each job: start, finish, and the reason of a cancel or pause."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

import tether
from tests.helpers import eventually, fast_config
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
