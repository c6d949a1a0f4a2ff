"""Waiting for a cancellation through the REST API waits for the job to stop, and does
not report an error that no longer holds."""

from __future__ import annotations

from tests.helpers import fast_config
from tether import App, Worker

from .support import Client


async def test_cancellation_status_wait_answers_once_the_job_stopped_without_stale_errors(
    tapp: App, authed: Client
) -> None:
    # No follow-up of the worker's to finish the record: waiting alone must do.
    worker = Worker(tapp, fast_config(rescue_interval=3600))
    await worker.start()
    try:
        res = await authed.post("alice", "/api/jobs", json={"task": "sleepy"})
        job_id = res.json()["id"]
        for _ in range(200):
            if (await tapp.get(job_id)).state.value == "running":
                break
            await worker.claimer.run_once()
        res = await authed.post("alice", f"/api/jobs/{job_id}/cancel", json={"wait": 0})
        assert (res.json()["status"], res.json()["outcome"]) == ("partial", "requested"), res.text
        res = await authed.get("alice", f"/api/jobs/{job_id}/cancellation-status?wait=10")
        status = res.json()
        assert status["stopped"] and status["state"] == "cancelled", status
        assert (status["settled"], status["success"], status["errors"]) == (True, True, []), status
        assert status["cancellation"]["status"] == "completed", status
        # The history stays: the request's own step says the job still ran at the time.
        assert "still running after 0s" in status["cancellation"]["steps"][1]["error"]
    finally:
        await worker.stop()
