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


async def test_the_job_page_shows_the_log_and_its_refresh_new_lines(
    tapp: App, authed: Client, job_in: JobIn
) -> None:
    from .support import dashboard_login

    job = await job_in("running", owner="alice")
    theirs = await job_in("queued", owner="bob")
    store = await tapp.store()
    http = await dashboard_login(authed, "alice")
    page = (await http.get(f"/jobs/{job.id}")).text
    section = page.split('id="job-log"', 1)[1].split("</section>", 1)[0]
    assert "Nothing logged yet" in section

    lines = [
        PendingLine(1_700_000_000.0, "info", "<script>alert(1)</script>"),
        PendingLine(1_700_000_001.0, "error", f"job {theirs.id} failed us"),
    ]
    assert await store.append_logs(job.id, job.lease_token, lines, **BOUNDS)
    # The live region the page refreshes every second.
    fragment = (await http.get(f"/jobs/{job.id}", params={"fragment": "1"})).text
    section = fragment.split('id="job-log"', 1)[1].split("</section>", 1)[0]
    assert section.count('class="log-line') == 2
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section and "<script>" not in section
    assert 'class="log-line log-error"' in section
    assert "(about a job you cannot see)" in section and f"job {theirs.id}" not in section
