"""``GET /api/events``: live transitions over Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from tether import App
from tether.auth import Tokens
from tether.job import Job, NewJob
from tether.store import create_store
from tether.web import ApiSettings, create_app

from .support import Client, live_server

JobIn = Callable[..., Awaitable[Job]]


def transitions(text: str) -> list[dict[str, Any]]:
    """The ``data`` of every ``transition`` event in an SSE body."""
    found = []
    for block in text.split("\n\n"):
        lines = block.splitlines()
        if "event: transition" in lines:
            data = next(line for line in lines if line.startswith("data: "))
            found.append(json.loads(data.removeprefix("data: ")))
    return found


async def test_stream_delivers_filtered_transitions(tapp: App, authed: Client) -> None:
    store = await tapp.store()
    # A stream follows already (a dashboard open elsewhere), so every transition is
    # stored for the streams below to replay by id.
    await store.announce_follower(60.0)
    start = await store.last_event_id()
    a = (await authed.post("alice", "/api/jobs", json={"task": "echo", "queue": "a"})).json()
    b = (await authed.post("bob", "/api/jobs", json={"task": "echo", "queue": "b"})).json()
    await authed.post("root", f"/api/jobs/{a['id']}/cancel")
    await authed.post("root", f"/api/jobs/{b['id']}/pause")

    async def stream(who: str, **params: Any) -> list[dict[str, Any]]:
        # ``limit`` ends a stream as soon as the expected events are in; ``timeout`` shows
        # that no more come.
        params = {"since": start, "timeout": 0.25, **params}
        res = await authed.get(who, "/api/events", params=params)
        assert res.status_code == 200 and res.headers["content-type"].startswith(
            "text/event-stream"
        )
        return transitions(res.text)

    every = await stream("eve", limit=4, timeout=10)
    assert [(t["job_id"], t["to_state"]) for t in every] == [
        (a["id"], "queued"),
        (b["id"], "queued"),
        (a["id"], "cancelled"),
        (b["id"], "paused"),
    ]
    assert every[2]["from_state"] == "queued" and every[2]["queue"] == "a"
    assert every[2]["actor"] == "root" and every[2]["event_id"] > every[1]["event_id"]
    assert [t["job_id"] for t in await stream("eve", queue="b")] == [b["id"], b["id"]]
    assert [t["to_state"] for t in await stream("eve", state="cancelled")] == ["cancelled"]
    assert [t["to_state"] for t in await stream("root", job=a["id"])] == ["queued", "cancelled"]
    assert len(await stream("root", limit=3, timeout=10)) == 3
    # Members see their own jobs' transitions only.
    assert {t["job_id"] for t in await stream("bob")} == {b["id"]}
    # Resuming after the last event seen (Last-Event-ID) replays nothing twice.
    res = await authed.get(
        "eve",
        "/api/events",
        params={"timeout": 0.3},
        headers={"Last-Event-ID": str(every[2]["event_id"])},
    )
    assert [t["to_state"] for t in transitions(res.text)] == ["paused"]


async def test_a_replay_over_a_time_no_stream_followed_misses_only_plain_transitions(
    tapp: App, authed: Client, db_url: str
) -> None:
    store = await tapp.store()
    start = await store.last_event_id()
    # Nothing follows: on PostgreSQL a plain enqueue's transition is not stored (its row
    # gives it), a cancellation's is.
    job = (await authed.post("alice", "/api/jobs", json={"task": "echo", "queue": "a"})).json()
    await authed.post("root", f"/api/jobs/{job['id']}/cancel")
    res = await authed.get("eve", "/api/events", params={"since": start, "timeout": 0.25})
    replayed = [t["to_state"] for t in transitions(res.text)]
    plain_stored = db_url.startswith("sqlite")
    assert replayed == (["queued", "cancelled"] if plain_stored else ["cancelled"])
    # The job's history has both either way.
    history = (await authed.get("eve", f"/api/jobs/{job['id']}/events")).json()["items"]
    assert [e["to_state"] for e in history] == ["queued", "cancelled"]
    assert (history[0]["id"] is None) is not plain_stored


async def test_stream_wakes_on_a_transition_made_while_it_waits(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    job = await job_in("queued")

    async def cancel_soon() -> None:
        await asyncio.sleep(0.3)
        await tapp.cancel(job.id)

    canceller = asyncio.create_task(cancel_soon())
    started = time.monotonic()
    # The feed polls every 60 s here: only the store's hint can wake it in time.
    res = await authed.get(
        "eve", "/api/events", params={"job": job.id, "limit": 1, "timeout": 20, "poll": 60}
    )
    await canceller
    assert [t["to_state"] for t in transitions(res.text)] == ["cancelled"]
    assert time.monotonic() - started < 5


@pytest.mark.postgres
async def test_sse_delivers_within_one_second_through_notify(pg_url: str) -> None:
    """A live server, a real HTTP stream, and a transition made over another connection:
    only PostgreSQL's NOTIFY can wake the stream (its poll is 60 s)."""
    app = App(pg_url)
    token, _ = await Tokens(app).create("root", "admin")
    await app.close()
    other = create_store(pg_url)
    await other.open()
    try:
        with live_server(create_app(App(pg_url), ApiSettings())) as base:
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                headers = {"Authorization": f"Bearer {token}"}
                latencies = []
                for _ in range(3):
                    [job] = await other.enqueue([NewJob(task="echo", args_json="{}", queue="q")])
                    params = {"job": job.id, "state": "cancelled", "poll": 60, "timeout": 10}
                    async with http.stream(
                        "GET", "/api/events", params=params, headers=headers
                    ) as res:
                        assert res.status_code == 200
                        lines = res.aiter_lines()
                        assert await anext(lines) == ": stream open"
                        await asyncio.sleep(0.2)  # the stream is subscribed and idle
                        await other.request_cancel(job.id, "by test", False, "test")
                        sent = time.monotonic()
                        async for line in lines:
                            if line.startswith("data: "):
                                latencies.append(time.monotonic() - sent)
                                assert json.loads(line[6:])["to_state"] == "cancelled"
                                break
                print("NOTIFY to SSE latencies (s):", [round(x, 4) for x in latencies])
                assert len(latencies) == 3 and max(latencies) < 1.0, latencies
    finally:
        await other.close()
