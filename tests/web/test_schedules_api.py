"""Schedules and the maintenance leader over the API and the dashboard."""

from __future__ import annotations

from tether import App
from tether.ops import MAINTENANCE

from .support import Client


def add_schedule(app: App) -> None:
    app.schedule("echo", cron="*/5 * * * *", name="tick", args={})


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
