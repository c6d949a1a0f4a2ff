"""The dashboard's job page, as HTML: what it says of a job's lease. On both stores."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tether.job import Job

from .support import Client, dashboard_login

JobIn = Callable[..., Awaitable[Job]]


async def test_a_finished_job_holds_no_lease_and_its_page_says_so(
    authed: Client, job_in: JobIn
) -> None:
    job = await job_in("succeeded")
    http = await dashboard_login(authed, "alice")
    page = (await http.get(f"/jobs/{job.id}")).text
    assert 'id="lease-none"' in page
    assert "None held: the job is succeeded" in page
    assert "expires" not in page.split("<h2>Lease</h2>", 1)[1].split("</section>", 1)[0]


async def test_a_running_job_shows_its_lease_and_owner(authed: Client, job_in: JobIn) -> None:
    job = await job_in("running")
    http = await dashboard_login(authed, "alice")
    page = (await http.get(f"/jobs/{job.id}")).text
    assert 'id="lease-none"' not in page
    assert f'id="lease-owner">{job.worker_id}<' in page


async def test_every_page_names_an_icon_that_is_served(authed: Client) -> None:
    http = await dashboard_login(authed, "alice")
    page = (await http.get("/")).text
    assert '<link rel="icon" href="/static/favicon.svg"' in page
    icon = await http.get("/static/favicon.svg")
    assert icon.status_code == 200
    assert icon.text.startswith("<svg")
