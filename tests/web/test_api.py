"""The REST API through an in-process ASGI client, on both stores."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.helpers import eventually, fast_config
from tether import App, Worker
from tether.job import Job

from .support import Client

JobIn = Callable[..., Awaitable[Job]]


def assert_error(res: object, status: int, code: str) -> dict[str, object]:
    """An error answer: the status, the JSON shape, the code, and no traceback."""
    assert res.status_code == status, res.text  # type: ignore[attr-defined]
    body = res.json()  # type: ignore[attr-defined]
    assert set(body) == {"code", "message", "request_id"}, body
    assert body["code"] == code, body
    assert "Traceback" not in res.text and 'File "' not in res.text  # type: ignore[attr-defined]
    return dict(body)


async def test_enqueue_read_list_and_history(authed: Client) -> None:
    res = await authed.post(
        "alice",
        "/api/jobs",
        json={"task": "echo", "args": {"n": 1}, "queue": "mail", "key": "k1", "priority": 5},
    )
    assert res.status_code == 201, res.text
    job = res.json()
    assert job["owner"] == "alice" and job["state"] == "queued" and job["args"] == {"n": 1}
    assert job["lease"]["worker_id"] is None and job["cancel_request"] is None
    child = await authed.post(
        "alice", "/api/jobs", json={"task": "echo", "depends_on": [job["id"]]}
    )
    assert child.status_code == 201 and child.json()["state"] == "blocked"

    detail = (await authed.get("alice", f"/api/jobs/{job['id']}")).json()
    assert detail["dependents"] == [child.json()["id"]] and detail["children"] == []
    assert detail["progress"] == {"current": None, "total": None}
    history = (await authed.get("alice", f"/api/jobs/{job['id']}/events")).json()["items"]
    assert [(e["from_state"], e["to_state"]) for e in history] == [(None, "queued")]

    page = (await authed.get("root", "/api/jobs", params={"queue": "mail"})).json()
    assert [j["id"] for j in page["items"]] == [job["id"]] and page["next_offset"] is None
    page = (await authed.get("root", "/api/jobs", params={"state": ["blocked"]})).json()
    assert [j["id"] for j in page["items"]] == [child.json()["id"]]
    page = (await authed.get("root", "/api/jobs", params={"limit": 1})).json()
    assert len(page["items"]) == 1 and page["next_offset"] == 1
    page = (await authed.get("root", "/api/jobs", params={"key": "k1", "task": "echo"})).json()
    assert [j["id"] for j in page["items"]] == [job["id"]]


async def test_idempotency_key_returns_the_same_job(authed: Client) -> None:
    body = {"task": "echo", "idempotency_key": "once"}
    first = await authed.post("alice", "/api/jobs", json=body)
    again = await authed.post("alice", "/api/jobs", json=body)
    assert first.json()["id"] == again.json()["id"]
    # Keys are scoped by owner: another member's same key makes its own job, answered
    # exactly like an unused key (no existence oracle).
    other = await authed.post("bob", "/api/jobs", json=body)
    assert other.status_code == 201
    assert other.json()["id"] != first.json()["id"]
    assert other.json()["idempotency_key"] == "once"


async def test_errors_are_json_with_stable_codes(authed: Client) -> None:
    assert_error(await authed.get("root", "/api/jobs/999999"), 404, "not_found")
    assert_error(await authed.get("root", "/api/nowhere"), 404, "not_found")
    assert_error(await authed.post("root", "/api/jobs", json={"task": "nope"}), 422, "unknown_task")
    assert_error(
        await authed.post("root", "/api/jobs", json={"task": "echo", "extra": 1}),
        422,
        "invalid_request",
    )
    assert_error(
        await authed.post("root", "/api/jobs", json={"task": "echo", "args": {"s": "a\x00b"}}),
        422,
        "invalid_job",
    )
    assert_error(
        await authed.post("root", "/api/jobs", json={"task": "echo", "depends_on": [999999]}),
        422,
        "invalid_job",
    )
    # The App's payload limit (64 KiB here) and the server's body limit (1 MiB).
    big = {"task": "echo", "args": {"blob": "x" * 100_000}}
    assert_error(await authed.post("root", "/api/jobs", json=big), 413, "payload_too_large")
    huge = b'{"task": "echo", "args": {"blob": "' + b"x" * (2 * 1024 * 1024) + b'"}}'
    res = await authed.post(
        "root", "/api/jobs", content=huge, headers={"content-type": "application/json"}
    )
    assert_error(res, 413, "payload_too_large")
    assert_error(
        await authed.get("root", "/api/jobs", params={"limit": 1001}), 422, "invalid_request"
    )
    assert_error(
        await authed.post("root", "/api/jobs", content=b"{not json", headers={
            "content-type": "application/json"}),
        422,
        "invalid_request",
    )  # fmt: skip
    res = await authed.post("root", "/api/jobs", json={"task": "echo"})
    queued = res.json()["id"]
    assert_error(await authed.post("root", f"/api/jobs/{queued}/retry"), 409, "illegal_transition")
    assert_error(await authed.post("root", f"/api/jobs/{queued}/resume"), 409, "illegal_transition")


async def test_a_streamed_body_over_the_limit_is_refused(authed: Client) -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(40):
            yield b"x" * 64 * 1024

    res = await authed.post(
        "root", "/api/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_error(res, 413, "payload_too_large")


async def test_request_id_is_echoed_or_made(authed: Client) -> None:
    res = await authed.get("root", "/api/stats", headers={"X-Request-ID": "abc-123"})
    assert res.headers["x-request-id"] == "abc-123"
    res = await authed.get("root", "/api/stats", headers={"X-Request-ID": "bad id\nforged"})
    assert (
        res.headers["x-request-id"] != "bad id\nforged" and len(res.headers["x-request-id"]) == 32
    )
    assert res.json()["total"] == 0


async def test_cancel_pause_resume_retry_delete(authed: Client, job_in: JobIn) -> None:
    queued = await job_in("queued")
    res = await authed.post("alice", f"/api/jobs/{queued.id}/pause", json={"reason": "hold"})
    assert res.json()["state"] == "paused"
    res = await authed.post("alice", f"/api/jobs/{queued.id}/resume", json={"budget": 5})
    assert res.json()["state"] == "queued" and res.json()["budget"] == 5
    res = await authed.post("alice", f"/api/jobs/{queued.id}/cancel", json={"reason": "stop"})
    assert res.status_code == 200, res.text
    result = res.json()
    assert result["outcome"] == "cancelled" and result["status"] == "completed"
    assert result["job"]["state"] == "cancelled" and result["steps"][0]["name"] == "request"
    status = (await authed.get("alice", f"/api/jobs/{queued.id}/cancellation-status")).json()
    assert status["settled"] and status["success"] and status["cancellation"]["reason"] == "stop"
    listed = (await authed.get("alice", "/api/cancellations")).json()["items"]
    assert [c["job_id"] for c in listed] == [queued.id]

    failed = await job_in("failed")
    res = await authed.post("alice", f"/api/jobs/{failed.id}/retry")
    assert res.json()["state"] == "queued" and res.json()["attempt"] == 0
    res = await authed.delete("alice", f"/api/jobs/{failed.id}")
    assert res.json() == {"deleted": failed.id, "children_cancelled": []}
    assert (await authed.get("alice", f"/api/jobs/{failed.id}")).status_code == 404


async def test_cancel_a_running_job_and_wait_for_its_status(tapp: App, authed: Client) -> None:
    worker = Worker(tapp, fast_config())
    await worker.start()
    try:
        res = await authed.post("alice", "/api/jobs", json={"task": "sleepy"})
        job_id = res.json()["id"]
        for _ in range(200):
            if (await tapp.get(job_id)).state.value == "running":
                break
            await worker.claimer.run_once()
        res = await authed.post("alice", f"/api/jobs/{job_id}/cancel", json={"wait": 0})
        assert res.json()["outcome"] == "requested", res.text
        res = await authed.get("alice", f"/api/jobs/{job_id}/cancellation-status?wait=10")
        status = res.json()
        assert status["settled"] and status["stopped"] and status["state"] == "cancelled", status
        # The record settled as partial when the cancel call stopped waiting (after 0 s);
        # once the job has stopped, the worker's follow-up completes it.
        first_step_error = status["cancellation"]["steps"][1]["error"]
        assert "still running after 0s" in first_step_error, status

        async def completed() -> dict[str, Any] | None:
            res = await authed.get("alice", f"/api/jobs/{job_id}/cancellation-status")
            body: dict[str, Any] = res.json()
            return body if body["cancellation"]["status"] == "completed" else None

        done = await eventually(completed)
        assert done["success"] and done["errors"] == []
        assert done["cancellation"]["steps"][-1]["name"] == "follow_up"
    finally:
        await worker.stop()


async def test_queues_keys_workers_and_stats(tapp: App, authed: Client, job_in: JobIn) -> None:
    running = await job_in("running", key="tenant-1")
    res = await authed.post("root", "/api/queues/bulk/pause", json={"reason": "maintenance"})
    assert res.json() == {
        "name": "bulk",
        "paused": True,
        "reason": "maintenance",
        "counts": {},
        "unserved": {},
    }
    queues = {q["name"]: q for q in (await authed.get("eve", "/api/queues")).json()["items"]}
    assert queues["bulk"]["paused"] and queues[running.queue]["counts"] == {"running": 1}
    res = await authed.post("root", "/api/queues/bulk/resume")
    assert res.json()["paused"] is False
    keys = (await authed.get("eve", "/api/keys")).json()["items"]
    assert {"name": "tenant-1", "kind": "key", "running": 1}.items() <= keys[0].items()
    stats = (await authed.get("eve", "/api/stats")).json()
    assert stats["states"]["running"] == 1 and stats["total"] == 1

    worker = Worker(tapp, fast_config(queues=("nothing",)))
    await worker.start(services=False)
    try:
        found = (await authed.get("eve", "/api/workers")).json()["items"]
        assert [w["id"] for w in found] == [worker.id] and found[0]["state"] == "active"
        assert found[0]["jobs"] == []
        assert (found[0]["abandoned_threads"], found[0]["thread_pool_full"]) == (0, False)
    finally:
        await worker.stop()


async def test_a_job_no_worker_serves_is_flagged_in_detail_and_queues(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    job = await job_in("queued")
    why = f"no worker serves task echo on queue {job.queue}"
    detail = (await authed.get("alice", f"/api/jobs/{job.id}")).json()
    assert detail["unserved"] == why + " (no worker is running)"
    worker = Worker(tapp, fast_config(queues=(job.queue,)))
    await worker.start(services=False)
    try:
        detail = (await authed.get("alice", f"/api/jobs/{job.id}")).json()
        assert detail["unserved"] is None
        (found,) = (await authed.get("eve", "/api/workers")).json()["items"]
        assert found["queues"] == [job.queue] and "echo" in found["tasks"]
    finally:
        await worker.stop()
    queues = {q["name"]: q for q in (await authed.get("eve", "/api/queues")).json()["items"]}
    assert queues[job.queue]["unserved"] == {"echo": why + " (no worker is running)"}


async def test_health_and_metrics(authed: Client, job_in: JobIn) -> None:
    res = await authed.get(None, "/health")
    health = res.json()
    assert res.status_code == 200 and health["database"]["reachable"]
    assert health["database"]["schema_version"] == health["database"]["expected_schema_version"]
    assert health["status"] == "degraded" and "no active worker" in health["problems"][0]

    job = await job_in("queued", queue="metered")
    await authed.post("alice", f"/api/jobs/{job.id}/cancel")
    assert_error(await authed.get(None, "/metrics"), 401, "unauthorized")
    res = await authed.get("eve", "/metrics")
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/plain")
    text = res.text
    for name in (
        "tether_cancellation_requests_total",
        "tether_cancellation_duration_seconds",
        "tether_cancellation_failures_total",
        "tether_runners_terminated_total",
        "tether_resources_cleaned_total",
        "tether_job_start_latency_seconds",
        "tether_job_run_duration_seconds",
        "tether_zombies_rescued_total",
        "tether_lease_losses_total",
        "tether_heartbeat_failures_total",
        "tether_force_kills_total",
        "tether_http_requests_total",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    assert 'tether_jobs{queue="metered",state="cancelled"} 1.0' in text


@pytest.mark.parametrize(
    "settings",
    [pytest.param(__import__("tether.web").web.ApiSettings(rate_per_second=1, rate_burst=3))],
)
async def test_rate_limit_per_token(authed: Client) -> None:
    answers = [(await authed.get("eve", "/api/stats")).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
    res = await authed.get("eve", "/api/stats")
    assert_error(res, 429, "rate_limited")
    assert int(res.headers["retry-after"]) >= 1
    # Another token has its own bucket.
    assert (await authed.get("alice", "/api/stats")).status_code == 200


async def test_a_jobs_steps_and_a_signal_that_wakes_it(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    queued = await job_in("queued")
    store = await tapp.store()
    (claimed,) = await store.claim("w1", [queued.queue], ["echo"], 1, 60.0)
    assert await store.save_step(queued.id, claimed.lease_token, "plan", '{"n": 2}')
    parked = await store.wait(
        "w1", queued.id, claimed.lease_token, "signal:approval", signal="approval",
        reason="waiting for signal 'approval'",
    )  # fmt: skip
    assert parked.outcome == "parked"

    res = await authed.get("alice", f"/api/jobs/{queued.id}/steps")
    assert res.status_code == 200, res.text
    body = res.json()
    assert [(s["name"], s["kind"], s["state"]) for s in body["items"]] == [
        ("plan", "step", "done"),
        ("signal:approval", "signal", "waiting"),
    ]
    assert body["items"][0]["result"] == {"n": 2} and body["items"][1]["wakes_at"] is None
    assert body["waiting_for"] == "waiting for signal 'approval', with no time limit"
    assert (await authed.get("bob", f"/api/jobs/{queued.id}/steps")).status_code == 404

    path = f"/api/jobs/{queued.id}/signals/approval"
    res = await authed.post("alice", path, json={"payload": {"approved": True}})
    assert res.json() == {"job_id": queued.id, "signal": "approval", "answer": "woke"}
    assert (await tapp.get(queued.id)).run_at <= datetime.now(UTC)
    again = await authed.post("alice", path, json={"payload": {"approved": True}})
    assert again.json()["answer"] == "duplicate"
    assert_error(
        await authed.post("alice", path, json={"payload": {"approved": False}}),
        409,
        "signal_conflict",
    )
    assert_error(
        await authed.post("alice", f"/api/jobs/{queued.id}/signals/bad%0Aname", json={}),
        422,
        "invalid_request",
    )
    done = await job_in("succeeded")
    assert_error(
        await authed.post("alice", f"/api/jobs/{done.id}/signals/approval", json={}),
        409,
        "illegal_transition",
    )
