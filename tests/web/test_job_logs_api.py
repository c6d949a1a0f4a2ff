"""``GET /api/jobs/{id}/logs``: a job's own log over REST, paged by seq, under the same
owner rules and redaction as the job's other reads."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.web.support import Client
from tether import App, JobState
from tether.job import Job, Outcome
from tether.joblog import PendingLine

JobIn = Callable[..., Awaitable[Job]]
BOUNDS = {"max_lines": 100, "max_bytes": 10_000}


async def test_a_jobs_log_is_read_after_a_seq_and_redacted_for_members(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    mine = await job_in("queued", owner="alice")
    theirs = await job_in("queued", owner="bob")
    store = await tapp.store()
    (claimed,) = await store.claim("w1", [mine.queue], ["echo"], 1, 60.0)
    lines = [
        PendingLine(1_700_000_000.0, "info", "starting"),
        PendingLine(1_700_000_001.0, "warning", f"waiting for job {theirs.id}"),
        PendingLine(1_700_000_002.0, "info", "done"),
    ]
    assert await store.append_logs(mine.id, claimed.lease_token, lines, **BOUNDS)
    path = f"/api/jobs/{mine.id}/logs"

    res = await authed.get("alice", path)
    assert res.status_code == 200, res.text
    body = res.json()
    assert [(x["seq"], x["level"], x["message"]) for x in body["items"]] == [
        (1, "info", "starting"),
        (2, "warning", "(about a job you cannot see)"),
        (3, "info", "done"),
    ]
    assert body["items"][0]["attempt"] == 1 and body["items"][0]["at"].startswith("2023-11-14")
    assert (body["next_after"], body["finished"], body["hidden_jobs"]) == (3, False, 1)

    # The admin sees every job: nothing redacted.
    admin = (await authed.get("root", path)).json()
    assert admin["items"][1]["message"] == f"waiting for job {theirs.id}"

    page = (await authed.get("alice", path, params={"after": 1, "limit": 1})).json()
    assert [x["seq"] for x in page["items"]] == [2] and page["next_after"] == 2
    empty = (await authed.get("alice", path, params={"after": 3})).json()
    assert (empty["items"], empty["next_after"]) == ([], 3)

    finished = Outcome(mine.id, claimed.lease_token, JobState.SUCCEEDED)
    assert await store.finish("w1", [finished]) == {mine.id}
    assert (await authed.get("alice", path, params={"after": 3})).json()["finished"] is True

    # Another member's job, and a job that does not exist, are not found alike.
    assert (await authed.get("bob", path)).status_code == 404
    assert (await authed.get("alice", "/api/jobs/999999/logs")).status_code == 404
    assert (await authed.get("alice", path, params={"after": -1})).status_code == 422
