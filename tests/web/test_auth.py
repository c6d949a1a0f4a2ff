"""Tokens, roles, ownership and the audit log: every role on every mutating endpoint,
BOLA walks, denied attempts in the audit log, and no token in any log line."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from tether import App
from tether.audit import Audit
from tether.auth import Tokens, hash_token
from tether.job import AuditEntry, Job
from tether.web import ApiSettings, create_app

from .support import Client

JobIn = Callable[..., Awaitable[Job]]
CALLERS = ("root", "alice", "bob", "eve", None, "tether_not-a-real-token")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A mutating endpoint: how to call it, the state its job needs, who may use it."""

    name: str
    method: str
    path: str  # {id} and {queue} are filled in
    state: str | None  # the state of alice's job it acts on; None: no job
    body: dict[str, Any] | None = None
    admin_only: bool = False
    success: int = 200

    @property
    def action(self) -> str:
        """The audit log's name for it."""
        return "queue." + self.name[6:] if self.admin_only else f"job.{self.name}"


ENDPOINTS = [
    Endpoint("enqueue", "POST", "/api/jobs", None, {"task": "echo"}, success=201),
    Endpoint("cancel", "POST", "/api/jobs/{id}/cancel", "queued", {"reason": "r"}),
    Endpoint("pause", "POST", "/api/jobs/{id}/pause", "queued"),
    Endpoint("resume", "POST", "/api/jobs/{id}/resume", "paused"),
    Endpoint("retry", "POST", "/api/jobs/{id}/retry", "failed"),
    Endpoint("delete", "DELETE", "/api/jobs/{id}", "queued"),
    Endpoint("signal", "POST", "/api/jobs/{id}/signals/approval", "queued", {"payload": 1}),
    Endpoint("queue-pause", "POST", "/api/queues/{queue}/pause", None, admin_only=True),
    Endpoint("queue-resume", "POST", "/api/queues/{queue}/resume", None, admin_only=True),
]


def expected_status(ep: Endpoint, caller: str | None) -> int:
    """What ``caller`` must get from ``ep`` acting on alice's job."""
    if caller not in ("root", "alice", "bob", "eve"):
        return 401
    if caller == "eve" or (ep.admin_only and caller != "root"):
        return 403
    if caller == "bob" and ep.state is not None:
        return 404  # another member's job: as if it did not exist
    return ep.success


async def snapshot(app: App, job: Job) -> tuple[Job, int]:
    """The job as stored now and the length of its history."""
    return await app.get(job.id), len(await app.jobs.events(job.id))


async def audit_rows(app: App, request_id: str) -> list[AuditEntry]:
    return [e for e in await Audit(app).list(1000) if e.request_id == request_id]


@pytest.mark.parametrize("ep", ENDPOINTS, ids=lambda ep: ep.name)
async def test_every_role_on_every_mutating_endpoint(
    tapp: App, authed: Client, job_in: JobIn, ep: Endpoint
) -> None:
    for caller in CALLERS:
        job = await job_in(ep.state) if ep.state is not None else None
        before = await snapshot(tapp, job) if job is not None else None
        path = ep.path.format(id=job.id if job else 0, queue=f"q-{ep.name}")
        request_id = f"{ep.name}.{caller or 'none'}"[:60].replace("_", "-")
        res = await authed.request(
            ep.method, caller, path, json=ep.body, headers={"X-Request-ID": request_id}
        )
        want = expected_status(ep, caller)
        assert res.status_code == want, (ep.name, caller, res.status_code, res.text)
        rows = await audit_rows(tapp, request_id)
        assert len(rows) == 1, (ep.name, caller, rows)
        row = rows[0]
        assert row.result == ("ok" if want < 300 else "denied"), (ep.name, caller, row)
        assert row.actor == (caller if want != 401 else "unauthenticated")
        assert row.action == ep.action, (row.action, ep.action)
        if want >= 400 and job is not None:
            # Refused: the row is untouched.
            assert await snapshot(tapp, job) == before, (ep.name, caller)
        if want == 404:
            assert res.json()["message"] == f"job {job.id} does not exist"  # type: ignore[union-attr]


async def test_bola_walking_ids_changes_nothing(tapp: App, authed: Client, job_in: JobIn) -> None:
    alices = [await job_in(state) for state in ("queued", "paused", "failed", "running")]
    bobs = await job_in("queued", owner="bob")
    before = {j.id: await snapshot(tapp, j) for j in alices}
    top = max(j.id for j in [*alices, bobs]) + 3
    attempts = 0
    for job_id in range(1, top + 1):
        if job_id == bobs.id:
            continue
        for method, path, body in (
            ("GET", f"/api/jobs/{job_id}", None),
            ("GET", f"/api/jobs/{job_id}/events", None),
            ("GET", f"/api/jobs/{job_id}/cancellation-status", None),
            ("POST", f"/api/jobs/{job_id}/cancel", {"force": True}),
            ("POST", f"/api/jobs/{job_id}/pause", None),
            ("POST", f"/api/jobs/{job_id}/resume", None),
            ("POST", f"/api/jobs/{job_id}/retry", None),
            ("DELETE", f"/api/jobs/{job_id}", None),
            ("GET", f"/api/events?job={job_id}&timeout=0.1", None),
        ):
            res = await authed.request(method, "bob", path, json=body)
            # Existing or not, another member's job reads exactly like a missing one.
            assert res.status_code == 404, (method, path, res.text)
            assert res.json()["message"] == f"job {job_id} does not exist"
            attempts += 1
    assert {j: await snapshot(tapp, (await tapp.get(j))) for j in before} == before
    bobs_rows = [e for e in await Audit(tapp).list(1000) if e.actor == "bob"]
    denied = [e for e in bobs_rows if e.result == "denied"]
    # A missing job and another's are refused with the same work: one denied row each.
    assert len(denied) == attempts
    assert {e.target for e in denied} == {f"job:{j}" for j in range(1, top + 1)} - {
        f"job:{bobs.id}"
    }
    assert {e.result for e in bobs_rows} == {"ok", "denied"}


async def test_members_see_only_their_own_jobs(tapp: App, authed: Client, job_in: JobIn) -> None:
    mine = await job_in("queued", owner="bob")
    alices = await job_in("queued")
    await authed.post("alice", f"/api/jobs/{alices.id}/cancel")
    await authed.post("bob", f"/api/jobs/{mine.id}/cancel")
    running = await job_in("running")

    listed = (await authed.get("bob", "/api/jobs")).json()["items"]
    assert [j["id"] for j in listed] == [mine.id]
    assert (await authed.get("bob", "/api/jobs?owner=alice")).json()["items"] == []
    assert len((await authed.get("eve", "/api/jobs")).json()["items"]) == 3
    records = (await authed.get("bob", "/api/cancellations")).json()["items"]
    assert [r["job_id"] for r in records] == [mine.id]
    assert len((await authed.get("root", "/api/cancellations")).json()["items"]) == 2
    # A member depending on another member's job gets the answer of an unknown id.
    res = await authed.post("bob", "/api/jobs", json={"task": "echo", "depends_on": [alices.id]})
    assert (
        res.status_code == 422 and res.json()["message"] == f"unknown dependency id(s): {alices.id}"
    )
    assert running.worker_id == "test-worker"


async def test_viewers_read_and_only_admins_read_the_audit_log(
    authed: Client, job_in: JobIn
) -> None:
    job = await job_in("queued")
    for path in ("/api/jobs", f"/api/jobs/{job.id}", "/api/queues", "/api/workers", "/api/stats"):
        assert (await authed.get("eve", path)).status_code == 200, path
    for who, status in (("root", 200), ("alice", 403), ("eve", 403), (None, 401)):
        assert (await authed.get(who, "/api/audit")).status_code == status, who
    rows = (await authed.get("root", "/api/audit")).json()["items"]
    assert rows[0]["action"] == "audit.read" and rows[0]["result"] == "denied"
    assert {"at", "actor", "action", "target", "result", "request_id"} <= set(rows[0])


async def test_a_revoked_token_is_refused_at_once(tapp: App, authed: Client) -> None:
    assert (await authed.get("alice", "/api/stats")).status_code == 200
    assert await Tokens(tapp).revoke("alice")
    res = await authed.get("alice", "/api/stats")
    assert res.status_code == 401 and res.json()["code"] == "unauthorized"
    assert res.headers["www-authenticate"] == "Bearer"
    # A new token under the same name owns alice's jobs again (rotation).
    token, _ = await Tokens(tapp).create("alice", "member")
    assert (await authed.get(token, "/api/stats")).status_code == 200


async def test_tokens_are_stored_only_as_hashes(tapp: App, tokens: dict[str, str]) -> None:
    listed = await Tokens(tapp).list()
    assert {t.name for t in listed} == set(tokens)
    for info in listed:
        assert info.token_hash == hash_token(tokens[info.name])
        assert tokens[info.name] not in repr(info) and info.token_hash not in repr(info)


async def _open_client(app: App, allow: bool) -> Client:
    api = create_app(app, ApiSettings(allow_anonymous=allow))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://t")
    return Client(http)


async def test_anonymous_admin_only_while_no_token_exists(tapp: App) -> None:
    closed = await _open_client(tapp, allow=False)
    opened = await _open_client(tapp, allow=True)
    try:
        assert (await closed.get(None, "/api/stats")).status_code == 401
        res = await opened.post(None, "/api/jobs", json={"task": "echo"})
        assert res.status_code == 201 and res.json()["owner"] == "anonymous"
        assert (await opened.get(None, "/api/audit")).json()["items"][0]["actor"] == "anonymous"
        await Tokens(tapp).create("root", "admin")
        assert (await opened.get(None, "/api/stats")).status_code == 401
    finally:
        await closed.http.aclose()
        await opened.http.aclose()


async def test_no_token_appears_in_any_log(
    tapp: App,
    authed: Client,
    tokens: dict[str, str],
    job_in: JobIn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    revoked, _ = await Tokens(tapp).create("temp", "member")
    await Tokens(tapp).revoke("temp")
    job = await job_in("queued")
    for who in (*tokens, revoked, "tether_" + "x" * 43, "garbage"):
        for method, path in (
            ("GET", "/api/jobs"),
            ("GET", f"/api/jobs/{job.id}"),
            ("POST", f"/api/jobs/{job.id}/pause"),
            ("POST", "/api/jobs/99999/cancel"),
            ("GET", "/api/audit"),
            ("GET", "/metrics"),
        ):
            await authed.request(method, who, path)
    await authed.post("root", "/api/jobs", json={"task": "echo", "args": {"x": "y" * 70_000}})
    secrets_ = [*tokens.values(), revoked, *(hash_token(t) for t in tokens.values())]
    assert caplog.records, "the requests logged nothing at all"
    logged = caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    for secret in secrets_:
        assert secret not in logged
    for row in await Audit(tapp).list(1000):
        assert not any(s in str(row) for s in secrets_)
