"""The API and the dashboard under hostile input: nesting, names, look-alike digits, other
principals' data, the audit trail, cross-site requests. On both stores, in process."""

from __future__ import annotations

import dataclasses
import gc
import inspect
import json
import logging
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from tether import App
from tether.audit import Audit
from tether.errors import ConfigError, IllegalTransitionError, InvalidJobError
from tether.job import Job
from tether.new_job import new_job
from tether.task import EnqueueOptions
from tether.web import ApiSettings, create_app

from .support import Client, add_tasks, free_port, live_server
from .support import dashboard_login as login

JobIn = Callable[..., Awaitable[Job]]
MAX_DEPTH = 64  # the documented nesting limit (tether.payload.MAX_DEPTH)


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


async def audit_rows(app: App) -> list[Any]:
    return await Audit(app).list(10_000)


# -- 1. nesting ------------------------------------------------------------------------------


async def test_deeply_nested_args_are_refused_before_anything_is_stored(
    tapp: App, authed: Client
) -> None:
    for depth in (MAX_DEPTH + 1, 300, 900):
        res = await authed.post(
            "alice", "/api/jobs", json={"task": "echo", "args": {"a": nested(depth)}}
        )
        assert res.status_code == 422, res.text
        assert res.json()["code"] == "invalid_job"
    with pytest.raises(InvalidJobError, match="nests deeper"):
        await tapp.enqueue("echo", {"a": nested(300)})
    assert await tapp.jobs.list() == []
    ok = await authed.post("alice", "/api/jobs", json={"task": "echo", "args": {"a": nested(40)}})
    assert ok.status_code == 201


async def test_deep_nesting_is_refused_the_same_way_with_little_stack_left(
    tapp: App, authed: Client
) -> None:
    # As under a tracer (coverage's) or a deep caller: a JSON parser recursing once per
    # level runs out of stack at a few hundred levels. The answer must not change.
    bodies = [
        json.dumps({"task": "echo", "args": {"a": nested(depth)}}) for depth in (300, 900)
    ] + ["[" * 5000]  # not even JSON, but a parser would recurse into it all the same
    headers = {"Content-Type": "application/json"}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 250)
    try:
        answers = [
            await authed.post("alice", "/api/jobs", content=body, headers=headers)
            for body in bodies
        ]
    finally:
        sys.setrecursionlimit(limit)
    assert [(r.status_code, r.json()["code"]) for r in answers] == [(422, "invalid_job")] * 3
    assert await tapp.jobs.list() == []


async def test_a_deep_job_stored_before_the_limit_does_not_break_any_listing(
    tapp: App, authed: Client
) -> None:
    opts = EnqueueOptions(owner="alice")
    new = new_job(tapp.tasks, "echo", {}, opts, max_payload_bytes=tapp.config.max_payload_bytes)
    deep = dataclasses.replace(new, args_json=json.dumps({"a": nested(500)}))
    (job,) = await (await tapp.store()).enqueue([deep])
    for who in ("root", "alice"):
        listed = await authed.get(who, "/api/jobs")
        assert listed.status_code == 200, listed.text
        assert listed.json()["items"][0]["args"] == {
            "unreadable": f"nested deeper than {MAX_DEPTH} levels; not shown"
        }
        assert (await authed.get(who, f"/api/jobs/{job.id}")).status_code == 200
    res = await authed.post("alice", f"/api/jobs/{job.id}/cancel", json={"wait": 0})
    assert res.status_code == 200, res.text


# -- 2. names ---------------------------------------------------------------------------------


BAD_NAMES = ["../jobs/38", "a/b", "..", ".", "a b", "tab\there", "x\x00y", "", "é"]


async def test_names_outside_the_safe_alphabet_are_refused_by_the_api(
    tapp: App, authed: Client
) -> None:
    for bad in BAD_NAMES:
        for field in ("queue", "key"):
            res = await authed.post("alice", "/api/jobs", json={"task": "echo", field: bad})
            assert res.status_code == 422, (field, bad, res.text)
    for path in ("/api/queues/..%2Fjobs%2F38/pause", "/api/queues/a%20b/pause"):
        res = await authed.post("root", path)
        assert res.status_code in (404, 422), (path, res.text)
    assert await tapp.jobs.list() == [] and await tapp.queues.list() == []
    ok = await authed.post("alice", "/api/jobs", json={"task": "echo", "queue": "mail:eu-1_a.b@x"})
    assert ok.status_code == 201, ok.text


async def test_names_outside_the_safe_alphabet_are_refused_by_the_python_api(tapp: App) -> None:
    for bad in BAD_NAMES:
        with pytest.raises(InvalidJobError, match="name"):
            await tapp.enqueue("echo", {}, queue=bad)
        with pytest.raises(InvalidJobError, match="name"):
            await tapp.enqueue("echo", {}, key=bad)
        with pytest.raises(InvalidJobError, match="name"):
            await tapp.queues.pause(bad)
        with pytest.raises(InvalidJobError, match="name"):
            await tapp.queues.configure_key(bad)
        with pytest.raises(ConfigError, match="name"):
            tapp.resource(bad, 1)
        with pytest.raises(ConfigError, match="name"):
            tapp.task(name=bad or "/")(lambda ctx: None)
    assert await tapp.jobs.list() == [] and await tapp.queues.list() == []


# -- 3, 4, 5: the dashboard, in process ---------------------------------------------------------


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


async def test_look_alike_digits_are_no_numbers_anywhere(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    job = await job_in("queued")
    last_event_id: Any = "²".encode()  # a header is bytes on the wire
    res = await authed.get(
        "alice", "/api/events?timeout=0.2", headers={"Last-Event-ID": last_event_id}
    )
    assert res.status_code == 200, res.text
    http = await login(authed, "alice")
    page = await http.get("/jobs")
    res = await http.post(
        "/jobs/bulk-cancel",
        data={"csrf": csrf_of(page.text), "target": "/jobs/bulk-cancel", "ids": ["²", "٣"]},
    )
    assert res.status_code == 303
    assert (await tapp.get(job.id)).state.value == "queued"
    for path in ("/jobs/²", "/jobs/٣", f"/jobs/{job.id}²"):
        assert (await http.get(path)).status_code == 404, path


async def test_a_missing_job_page_is_a_404_that_looks_like_another_principals_job(
    authed: Client, job_in: JobIn
) -> None:
    roots = await job_in("queued", owner="root")
    missing = roots.id + 1000
    http = await login(authed, "alice")
    hidden = await http.get(f"/jobs/{roots.id}")
    absent = await http.get(f"/jobs/{missing}")
    assert hidden.status_code == absent.status_code == 404
    assert 'class="active">Jobs' in hidden.text.replace('href="/jobs" ', "")  # the nav
    assert hidden.text.replace(f"job {roots.id} does", "job N does") == absent.text.replace(
        f"job {missing} does", "job N does"
    )


async def test_a_nul_in_the_dashboard_filters_finds_nothing(authed: Client, job_in: JobIn) -> None:
    await job_in("queued")
    http = await login(authed, "alice")
    for query in ("queue=a%00b", "task=ec%00ho", "q=%00"):
        res = await http.get(f"/jobs?{query}")
        assert res.status_code == 200, (query, res.status_code)
        assert "data-job=" not in res.text


async def test_a_form_sent_to_another_path_than_it_names_is_refused(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    victim = await job_in("queued", owner="alice")
    http = await login(authed, "root")
    csrf = csrf_of((await http.get("/queues")).text)
    # What a browser posts for a form built for queue "../jobs/N": the job's pause.
    res = await http.post(
        f"/jobs/{victim.id}/pause",
        data={"csrf": csrf, "target": f"/queues/../jobs/{victim.id}/pause"},
    )
    assert res.status_code == 403
    assert (await tapp.get(victim.id)).state.value == "queued"
    rows = [r for r in await audit_rows(tapp) if r.action == "dashboard.post"]
    assert rows and rows[0].result == "denied" and "target" in (rows[0].detail or "")
    res = await http.post(
        f"/jobs/{victim.id}/pause", data={"csrf": csrf, "target": f"/jobs/{victim.id}/pause"}
    )
    assert res.status_code == 303
    assert (await tapp.get(victim.id)).state.value == "paused"


# -- 6. other principals ---------------------------------------------------------------------


async def test_a_cascade_into_another_principals_job_lists_only_a_count(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    mine = await job_in("queued", owner="alice", delay=3600)
    theirs = await tapp.enqueue("echo", {}, owner="bob", depends_on=(mine.id,), queue=mine.queue)
    res = await authed.post("alice", f"/api/jobs/{mine.id}/cancel", json={"wait": 0})
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["tasks_cancelled"] == [mine.id] and body["hidden_jobs"] == 1
    assert (await tapp.get(theirs.id)).state.value == "cancelled"  # the cascade still ran

    def ids_in(value: Any) -> set[int]:
        if isinstance(value, dict):
            return set().union(*(ids_in(v) for k, v in value.items() if k != "job"))
        if isinstance(value, list):
            return set().union(*(ids_in(v) for v in value)) | {
                v for v in value if isinstance(v, int)
            }
        if isinstance(value, str):
            return {int(n) for n in re.findall(r"job (\d+)", value)}
        return set()

    assert theirs.id not in ids_in(body)
    status = (await authed.get("alice", f"/api/jobs/{mine.id}/cancellation-status")).json()
    assert theirs.id not in ids_in(status) and status["cancellation"]["hidden_jobs"] == 1
    listed = (await authed.get("alice", "/api/cancellations")).json()
    assert theirs.id not in ids_in(listed)
    admin = (await authed.post("root", f"/api/jobs/{mine.id}/cancel", json={"wait": 0})).json()
    assert theirs.id in admin["tasks_cancelled"]


async def test_idempotency_keys_are_scoped_by_owner(tapp: App, authed: Client) -> None:
    body = {"task": "echo", "idempotency_key": "nightly"}
    alices = await authed.post("alice", "/api/jobs", json=body)
    # Bob cannot tell whether alice used the key: the answer is that of an unused key.
    bobs = await authed.post("bob", "/api/jobs", json=body)
    fresh = await authed.post("bob", "/api/jobs", json={**body, "idempotency_key": "unused"})
    assert alices.status_code == bobs.status_code == fresh.status_code == 201
    assert len({alices.json()["id"], bobs.json()["id"]}) == 2
    again = await authed.post("bob", "/api/jobs", json=body)
    assert again.json()["id"] == bobs.json()["id"]
    # Ownerless jobs (the Python API's) keep one key space, as before.
    a = await tapp.enqueue("echo", {}, idempotency_key="nightly")
    b = await tapp.enqueue("echo", {}, idempotency_key="nightly")
    assert a.id == b.id and a.id not in (alices.json()["id"], bobs.json()["id"])
    assert a.idempotency_key == "nightly"


async def test_a_hidden_and_a_missing_job_are_refused_with_the_same_work(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    bobs = await job_in("queued", owner="bob")
    missing = bobs.id + 1000
    for path in ("/api/jobs/{}", "/api/jobs/{}/events"):
        counts = []
        for job_id in (bobs.id, missing):
            before = len(await audit_rows(tapp))
            res = await authed.get("alice", path.format(job_id))
            assert res.status_code == 404
            counts.append(len(await audit_rows(tapp)) - before)
        assert counts == [1, 1], path


async def test_a_server_can_hide_totals_from_members(tapp: App, tokens: dict[str, str]) -> None:
    api = create_app(tapp, ApiSettings(rate_burst=10_000, members_see_totals=False))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://tether.test"
    ) as http:
        client = Client(http, tokens)
        for path in ("/api/stats", "/api/queues", "/api/keys"):
            assert (await client.get("alice", path)).status_code == 403, path
            assert (await client.get("root", path)).status_code == 200, path
        http.cookies.clear()
        dash = await login(client, "alice")
        assert (await dash.get("/")).status_code == 200
        queues = await dash.get("/queues")
        assert queues.status_code == 200 and 'id="totals-hidden"' in queues.text


async def test_hidden_totals_stay_hidden_everywhere_and_each_refusal_is_audited(
    tapp: App, tokens: dict[str, str]
) -> None:
    api = create_app(tapp, ApiSettings(rate_burst=10_000, members_see_totals=False))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://tether.test"
    ) as http:
        client = Client(http, tokens)
        for owner, queue in (("alice", "alices-queue"), ("bob", "bobs-secret-queue")):
            res = await client.post(owner, "/api/jobs", json={"task": "echo", "queue": queue})
            assert res.status_code == 201, res.text
        paths = ("/api/stats", "/api/queues", "/api/keys", "/metrics")
        for path in paths:
            res = await client.get("alice", path)
            assert res.status_code == 403, path
            assert "bobs-secret-queue" not in res.text
        metrics = await client.get("root", "/metrics")
        assert metrics.status_code == 200 and "bobs-secret-queue" in metrics.text
        denied = {
            r.target for r in await audit_rows(tapp) if (r.actor, r.result) == ("alice", "denied")
        }
        assert denied == set(paths)
        http.cookies.clear()
        dash = await login(client, "alice")
        page = await dash.get("/jobs")
        assert page.status_code == 200
        assert "alices-queue" in page.text and "bobs-secret-queue" not in page.text


# -- 7. audit --------------------------------------------------------------------------------


async def test_every_python_api_mutation_is_audited_with_the_apps_actor(db_url: str) -> None:
    app = App(db_url, actor="deploy-bot")
    add_tasks(app)
    try:
        job = await app.enqueue("echo", {}, delay=3600)
        await app.enqueue_many([("echo", {}), ("echo", {})])
        await app.jobs.pause(job.id)
        await app.jobs.resume(job.id)
        await app.cancel(job.id, wait=0)
        other = await app.enqueue("echo", {}, delay=3600)
        await app.jobs.delete(other.id)
        await app.queues.pause("mail")
        await app.queues.resume("mail")
        await app.queues.configure_key("tenant-1", max_running=2)
        with pytest.raises(IllegalTransitionError):
            await app.jobs.retry(job.id)  # a refused change is audited too
        rows = list(reversed(await audit_rows(app)))
        assert {r.actor for r in rows} == {"deploy-bot"}
        assert [r.action for r in rows] == [
            "job.enqueue",
            "job.enqueue",
            "job.pause",
            "job.resume",
            "job.cancel",
            "job.enqueue",
            "job.delete",
            "queue.pause",
            "queue.resume",
            "key.configure",
            "job.retry",
        ]
        assert rows[0].target == f"job:{job.id}" and rows[-1].result == "failed"
    finally:
        await app.close()


async def test_rate_limits_schedules_and_pruning_are_audited_and_checked(db_url: str) -> None:
    app = App(db_url, actor="ops-bot")
    add_tasks(app)
    app.schedules.declare("echo", cron="* * * * *", name="every-minute")
    try:
        await app.queues.rate_limit(queue="mail", per_second=2)
        await app.queues.remove_rate_limit(queue="mail")
        with pytest.raises(InvalidJobError, match="bad queue name"):
            await app.queues.rate_limit(queue="../jobs/38", per_second=1)
        await app.schedules.pause("every-minute")
        await app.schedules.resume("every-minute")
        await app.admin.prune(dry_run=True)
        rows = list(reversed(await audit_rows(app)))
        assert [(r.actor, r.action, r.target, r.result) for r in rows] == [
            ("ops-bot", "rate_limit.set", "queue:mail", "ok"),
            ("ops-bot", "rate_limit.remove", "queue:mail", "ok"),
            ("ops-bot", "rate_limit.set", "queue:../jobs/38", "failed"),
            ("ops-bot", "schedule.pause", "schedule:every-minute", "ok"),
            ("ops-bot", "schedule.resume", "schedule:every-minute", "ok"),
            ("ops-bot", "retention.prune", "jobs (dry run)", "ok"),
        ]
        assert await app.queues.rate_limits() == []
    finally:
        await app.close()


async def test_the_api_writes_one_audit_row_per_change(tapp: App, authed: Client) -> None:
    res = await authed.post("alice", "/api/jobs", json={"task": "echo"})
    rows = await audit_rows(tapp)
    assert [(r.actor, r.action) for r in rows] == [("alice", "job.enqueue")]
    assert rows[0].target == f"job:{res.json()['id']}"


async def test_login_csrf_refusals_logouts_and_rate_limits_are_audited(
    tapp: App, tokens: dict[str, str]
) -> None:
    api = create_app(tapp, ApiSettings(rate_per_second=0.001, rate_burst=3))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://tether.test"
    ) as http:
        res = await http.post("/login", data={"token": tokens["root"], "csrf": "forged"})
        assert res.status_code == 403
        dash = await login(Client(http, tokens), "root")
        csrf = csrf_of((await dash.get("/jobs")).text)
        assert (await dash.post("/logout", data={"csrf": csrf, "target": "/logout"})).is_redirect
        client = Client(http, tokens)
        codes = [(await client.get("eve", "/api/stats")).status_code for _ in range(8)]
        assert codes.count(429) >= 4
    rows = await audit_rows(tapp)
    seen = {(r.actor, r.action, r.result) for r in rows}
    assert ("unauthenticated", "dashboard.login", "denied") in seen
    assert ("root", "dashboard.logout", "ok") in seen
    limited = [r for r in rows if r.result == "rate_limited"]
    assert len(limited) == 1 and limited[0].actor == "eve"  # once per client and minute


# -- 8. smaller points ------------------------------------------------------------------------


async def test_cross_site_mutations_are_refused(tapp: App, authed: Client, job_in: JobIn) -> None:
    job = await job_in("queued", owner="alice")
    for headers in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://127.0.0.1:9999"},
        {"Origin": "null"},
    ):
        res = await authed.post("alice", f"/api/jobs/{job.id}/cancel", headers=headers)
        assert res.status_code == 403, headers
        assert res.json()["code"] == "forbidden"
    assert (await tapp.get(job.id)).state.value == "queued"
    same = {"Sec-Fetch-Site": "same-origin", "Origin": "http://tether.test"}
    assert (
        await authed.get("alice", "/api/jobs", headers={"Sec-Fetch-Site": "cross-site"})
    ).status_code == 200
    res = await authed.post("alice", f"/api/jobs/{job.id}/cancel", headers=same)
    assert res.status_code == 200


async def test_cross_site_refusals_are_audited_with_who_sent_them(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    job = await job_in("queued", owner="alice")
    cross = {"Sec-Fetch-Site": "cross-site"}
    res = await authed.post("alice", f"/api/jobs/{job.id}/cancel", headers=cross)
    assert res.status_code == 403
    http = await login(authed, "root")
    page = await http.get(f"/jobs/{job.id}")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    target = f"/jobs/{job.id}/pause"
    res = await http.post(target, data={"csrf": csrf.group(1), "target": target}, headers=cross)
    assert res.status_code == 403
    http.cookies.clear()
    res = await http.post("/login", data={"token": (authed.tokens or {})["eve"]}, headers=cross)
    assert res.status_code == 403
    assert (await tapp.get(job.id)).state.value == "queued"
    rows = {
        (r.actor, r.action, r.target)
        for r in await audit_rows(tapp)
        if r.result == "denied" and "another site" in (r.detail or "")
    }
    assert rows == {
        ("alice", "api.post", f"/api/jobs/{job.id}/cancel"),
        ("root", "dashboard.post", target),
        ("unauthenticated", "dashboard.login", "/login"),
    }


async def test_a_flood_of_cross_site_posts_leaves_a_bounded_trail(
    tapp: App, authed: Client
) -> None:
    from tether.web.guard import AUDITED_PER_MINUTE

    for _ in range(AUDITED_PER_MINUTE + 20):
        res = await authed.http.post("/login", headers={"Sec-Fetch-Site": "cross-site"})
        assert res.status_code == 403
    rows = [r for r in await audit_rows(tapp) if r.action == "dashboard.login"]
    # A minute boundary inside the loop may add one more batch; never one row per post.
    assert AUDITED_PER_MINUTE <= len(rows) <= 2 * AUDITED_PER_MINUTE
    assert any("not recorded" in (r.detail or "") for r in rows)


async def test_request_bodies_are_strict(authed: Client, job_in: JobIn) -> None:
    job = await job_in("queued")
    for body in ({"force": 0.0}, {"force": "true"}, {"cascade": 1}, {"wait": "1"}):
        res = await authed.post("alice", f"/api/jobs/{job.id}/cancel", json=body)
        assert res.status_code == 422, body
    res = await authed.post("alice", "/api/jobs", json={"task": "echo", "priority": "1"})
    assert res.status_code == 422
    res = await authed.post("alice", "/api/jobs", json={"task": "echo", "delay": 1})
    assert res.status_code == 201  # an integer is a number


async def test_method_not_allowed_names_every_allowed_method(authed: Client) -> None:
    for path, allowed in (
        ("/api/jobs", "GET, POST"),
        ("/api/jobs/1", "DELETE, GET"),
        ("/api/jobs/1/cancel", "POST"),
    ):
        res = await authed.request("OPTIONS", "root", path)
        assert res.status_code == 405
        assert res.headers["allow"] == allowed, path


async def test_the_cdn_docs_are_off_unless_asked_for(tapp: App) -> None:
    for docs, want in ((False, 404), (True, 200)):
        api = create_app(tapp, ApiSettings(docs=docs))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=api), base_url="http://tether.test"
        ) as http:
            assert (await http.get("/docs")).status_code == want
            assert (await http.get("/openapi.json")).status_code == 200


async def test_a_look_alike_digit_in_the_dashboards_event_stream_is_no_job(
    tapp: App, tokens: dict[str, str], settings: ApiSettings
) -> None:
    # A stream runs until the client leaves: a real server, so the test can leave.
    with live_server(create_app(tapp, settings)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            await login(Client(http, tokens), "alice")
            async with http.stream("GET", "/ui/events?job=²") as res:
                assert res.status_code == 200
                assert res.headers["content-type"].startswith("text/event-stream")


async def test_a_token_too_long_for_a_header_line_gets_the_apis_json_401(
    tapp: App, settings: ApiSettings
) -> None:
    from tether.web.app import server_config

    api = create_app(tapp, settings)
    config = server_config(api, "127.0.0.1", free_port(), settings, log_level="warning")
    with live_server(api, config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            for size in (20_000, 60_000):
                res = await http.get("/api/jobs", headers={"Authorization": "Bearer " + "x" * size})
                assert res.status_code == 401, size
                assert res.json()["code"] == "unauthorized"
            # Past the documented header limit the HTTP server answers, before tether.
            res = await http.get("/api/jobs", headers={"Authorization": "Bearer " + "x" * 2**20})
            assert res.status_code == 400


async def test_a_client_leaving_an_event_stream_logs_nothing_above_debug(
    tapp: App, authed: Client, settings: ApiSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with live_server(create_app(tapp, settings)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            for _ in range(10):
                headers = authed.headers("alice")
                async with http.stream("GET", "/api/events", headers=headers) as res:
                    assert res.status_code == 200
                    async for _line in res.aiter_lines():
                        break  # ": stream open", then leave
            # The server notices each departure; give it a request to be sure it did.
            assert (await http.get("/health")).status_code in (200, 503)
    gc.collect()
    loud = [r for r in caplog.records if r.levelno > logging.DEBUG and r.name != "httpx"]
    assert loud == [], [r.getMessage() for r in loud]


def test_checkpoints_and_results_obey_the_same_nesting_limit() -> None:
    from tether import payload

    assert payload.encode({"a": nested(MAX_DEPTH - 1)})  # the object itself is a level
    for value in ({"a": nested(MAX_DEPTH)}, nested(MAX_DEPTH + 1), nested(5000)):
        with pytest.raises(ValueError, match="nests deeper"):
            payload.encode(value)  # what save_checkpoint and a handler's result go through
