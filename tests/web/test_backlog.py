"""``GET /api/queues/backlog``: the backlog per queue an autoscaler polls, on both stores."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from tether import App
from tether.job import Job
from tether.web import ApiSettings, create_app

from .support import Client

JobIn = Callable[..., Awaitable[Job]]
PATH = "/api/queues/backlog"


async def test_the_backlog_counts_waiting_due_and_running_jobs_per_queue_and_in_total(
    authed: Client, job_in: JobIn
) -> None:
    # Claimed ones first: a claim takes the oldest queued job.
    await job_in("running", queue="ingest")
    await job_in("failed", queue="ingest")  # not waiting
    await job_in("queued", queue="ingest")
    await job_in("queued", queue="ingest", delay=3600)  # waiting, not due
    await job_in("queued", queue="reports")
    assert (await authed.post("root", "/api/queues/reports/pause")).status_code == 200

    res = await authed.get("eve", PATH)  # a viewer may read it
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["queues"]["ingest"] == {
        "queued": 2,
        "due": 1,
        "running": 1,
        "demand": 2,
        "paused": False,
    }
    assert body["queues"]["reports"] == {
        "queued": 1,
        "due": 1,
        "running": 0,
        "demand": 0,  # paused: its due jobs want no worker
        "paused": True,
    }
    assert body["total"] == {"queued": 3, "due": 2, "running": 1, "demand": 2}
    assert set(body) == {"queues", "total"}

    # One queue's figure for a scaler: named queues are always listed (zeros if empty),
    # and the total sums only them.
    res = await authed.get("root", PATH, params=[("queue", "ingest"), ("queue", "idle")])
    body = res.json()
    assert list(body["queues"]) == ["ingest", "idle"]
    assert body["queues"]["idle"] == {
        "queued": 0,
        "due": 0,
        "running": 0,
        "demand": 0,
        "paused": False,
    }
    assert body["total"] == {"queued": 2, "due": 1, "running": 1, "demand": 2}
    res = await authed.get("root", PATH, params={"queue": "bad name!"})
    assert res.status_code == 422 and res.json()["code"] == "invalid_request"


async def test_the_backlog_follows_the_token_rules(
    tapp: App, authed: Client, tokens: dict[str, str]
) -> None:
    res = await authed.get(None, PATH)
    assert res.status_code == 401 and res.headers["www-authenticate"] == "Bearer"
    res = await authed.get("not-a-token", PATH)
    assert res.status_code == 401 and res.json()["code"] == "unauthorized"
    assert (await authed.get("alice", PATH)).status_code == 200

    # A server that hides the totals from members hides the backlog too.
    api = create_app(tapp, ApiSettings(rate_burst=10_000, members_see_totals=False))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://tether.test"
    ) as http:
        client = Client(http, tokens)
        assert (await client.get("alice", PATH)).status_code == 403
        assert (await client.get("root", PATH)).status_code == 200
