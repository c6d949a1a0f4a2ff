"""Job meta through the REST API and the dashboard, on both stores."""

from __future__ import annotations

from tether import App

from .support import Client, dashboard_login

META = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "env": "prod"}


async def test_meta_is_enqueued_shown_and_listed(authed: Client, tapp: App) -> None:
    res = await authed.post("alice", "/api/jobs", json={"task": "echo", "meta": META})
    assert res.status_code == 201, res.text
    job = res.json()
    assert job["meta"] == META
    assert (await tapp.get(job["id"])).meta == META
    plain = (await authed.post("alice", "/api/jobs", json={"task": "echo"})).json()
    assert plain["meta"] is None

    detail = (await authed.get("alice", f"/api/jobs/{job['id']}")).json()
    assert detail["meta"] == META
    # A viewer sees a job's meta as it sees its args.
    assert (await authed.get("eve", f"/api/jobs/{job['id']}")).json()["meta"] == META

    def ids(page: dict[str, list[dict[str, int]]]) -> list[int]:
        return [j["id"] for j in page["items"]]

    page = (await authed.get("root", "/api/jobs", params={"meta": "env:prod"})).json()
    assert ids(page) == [job["id"]]
    both = {"meta": ["env:prod", f"traceparent:{META['traceparent']}"]}
    assert ids((await authed.get("root", "/api/jobs", params=both)).json()) == [job["id"]]
    assert ids((await authed.get("root", "/api/jobs", params={"meta": "env:dev"})).json()) == []
    # A member's listing stays its own, meta or not.
    assert ids((await authed.get("bob", "/api/jobs", params={"meta": "env:prod"})).json()) == []
    res = await authed.get("root", "/api/jobs", params={"meta": "env"})
    assert res.status_code == 422 and res.json()["code"] == "invalid_job", res.text


async def test_a_bad_meta_is_a_422_and_writes_nothing(authed: Client, tapp: App) -> None:
    for meta, code in [
        ({"bad key": "v"}, "invalid_job"),
        ({"k": "v" * 513}, "invalid_job"),
        ({f"k{i}": "v" for i in range(33)}, "invalid_job"),
        ({"k": "a\x00b"}, "invalid_job"),
        ({"k": 1}, None),  # refused by the body's model, before tether sees it
    ]:
        res = await authed.post("alice", "/api/jobs", json={"task": "echo", "meta": meta})
        assert res.status_code == 422, (meta, res.text)
        if code is not None:
            assert res.json()["code"] == code, res.text
    assert await tapp.jobs.list() == []


async def test_the_job_page_shows_meta(authed: Client, tapp: App) -> None:
    res = await authed.post("alice", "/api/jobs", json={"task": "echo", "meta": {"a<b": "x"}})
    assert res.status_code == 422  # not a meta key
    made = await authed.post("alice", "/api/jobs", json={"task": "echo", "meta": META})
    plain = await authed.post("alice", "/api/jobs", json={"task": "echo"})
    http = await dashboard_login(authed, "alice")
    page = (await http.get(f"/jobs/{made.json()['id']}")).text
    assert '<dt>meta</dt><dd id="job-meta"><code>env=prod</code> · ' in page
    assert f"<code>traceparent={META['traceparent']}</code>" in page
    assert 'id="job-meta"' not in (await http.get(f"/jobs/{plain.json()['id']}")).text
