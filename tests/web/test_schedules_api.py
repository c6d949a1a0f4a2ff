"""Schedules and the maintenance leader over the API and the dashboard."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tether import App
from tether.errors import ConfigError
from tether.ops import MAINTENANCE

from .support import Client, dashboard_login


def add_schedule(app: App) -> None:
    app.schedules.declare("echo", cron="*/5 * * * *", name="tick", args={})


async def test_schedules_are_listed_and_admins_pause_and_resume_them(
    tapp: App, authed: Client
) -> None:
    add_schedule(tapp)
    res = await authed.get("eve", "/api/schedules")
    assert res.status_code == 200, res.text
    [row] = res.json()["items"]
    assert (row["name"], row["cron"], row["paused"]) == ("tick", "*/5 * * * *", False)
    assert row["next_tick"] is not None and row["last_job_id"] is None
    assert row["declared_by"] == 0  # no worker runs: nobody declares it yet

    denied = await authed.post("alice", "/api/schedules/tick/pause")
    assert denied.status_code == 403
    paused = await authed.post("root", "/api/schedules/tick/pause")
    assert paused.status_code == 200 and paused.json()["paused"] is True
    assert paused.json()["next_tick"] is None
    resumed = await authed.post("root", "/api/schedules/tick/resume")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    missing = await authed.post("root", "/api/schedules/nope/pause")
    assert missing.status_code == 404
    actions = [(e.action, e.target, e.result) for e in await (await tapp.store()).list_audit(50, 0)]
    assert ("schedule.pause", "schedule:tick", "ok") in actions
    assert ("schedule.resume", "schedule:tick", "ok") in actions


async def test_workers_name_the_maintenance_leader(tapp: App, authed: Client) -> None:
    store = await tapp.store()
    await store.register_worker("h:1:aa", None, "h", 1, None, ["default"], 1)
    assert (await authed.get("eve", "/api/workers")).json()["leader"] is None
    await store.lead(MAINTENANCE, "h:1:aa", 60)
    assert (await authed.get("eve", "/api/workers")).json()["leader"] == "h:1:aa"


async def test_the_dashboard_shows_schedules_and_the_leader(
    tapp: App, client: Client, tokens: dict[str, str]
) -> None:
    add_schedule(tapp)
    store = await tapp.store()
    await store.register_worker("h:1:aa", None, "h", 1, None, ["default"], 1)
    await store.lead(MAINTENANCE, "h:1:aa", 60)
    http = client.http
    await http.get("/login")
    csrf = http.cookies.get("tether_login")
    assert csrf
    res = await http.post("/login", data={"token": tokens["root"], "csrf": csrf})
    assert res.status_code in (302, 303), res.text
    page = await http.get("/schedules")
    assert page.status_code == 200
    assert "tick" in page.text and "*/5 * * * *" in page.text and "Pause" in page.text
    workers = await http.get("/workers")
    assert "★ leader" in workers.text and "Maintenance leader: h:1:aa" in workers.text


async def submit(http: Any, page_html: str, action: str) -> Any:
    """Post the rendered form whose action is ``action``, with every field it carries,
    as a browser would."""
    forms = re.findall(r'<form method="post" action="([^"]+)"[^>]*>(.*?)</form>', page_html, re.S)
    for url, body in forms:
        if url == action:
            fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', body))
            return await http.post(url, data=fields)
    raise AssertionError(f"no form posts to {action}")


async def test_the_dashboard_pauses_and_resumes_a_schedule(
    tapp: App, client: Client, tokens: dict[str, str]
) -> None:
    add_schedule(tapp)
    client.tokens = tokens
    http = await dashboard_login(client, "root")
    page = await http.get("/schedules")
    res = await submit(http, page.text, "/schedules/tick/pause")
    assert res.status_code == 303, res.text
    [row] = (await client.get("root", "/api/schedules")).json()["items"]
    assert row["paused"] is True
    page = await http.get("/schedules")
    res = await submit(http, page.text, "/schedules/tick/resume")
    assert res.status_code == 303, res.text
    [row] = (await client.get("root", "/api/schedules")).json()["items"]
    assert row["paused"] is False
    actions = [(e.action, e.result) for e in await (await tapp.store()).list_audit(50, 0)]
    assert ("schedule.pause", "ok") in actions and ("schedule.resume", "ok") in actions
    assert ("dashboard.post", "denied") not in actions


@pytest.mark.parametrize("name", ["../jobs/1", "a/b", "..", "nightly report", "x" * 201])
def test_schedule_names_follow_the_safe_alphabet(tapp: App, name: str) -> None:
    with pytest.raises(ConfigError, match="schedule name"):
        tapp.schedules.declare("echo", cron="*/5 * * * *", name=name, args={})
