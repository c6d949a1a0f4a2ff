"""The dashboard end to end: headless Chromium (Debian's, through Playwright) against a
real ``tether serve`` process and real worker processes.

Skipped when /usr/bin/chromium is missing, except under CI=true, where it must run
(.ci/run installs it). Screenshots of every page go to test-artifacts/screenshots/ (or, with
TETHER_SCREENSHOTS=docs, to docs/screenshots/ for the README).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.web.support import free_port
from tether import App
from tether.auth import Tokens

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TETHER = str(Path(sys.executable).with_name("tether"))
# Test artifacts by default (git ignores them); TETHER_SCREENSHOTS=docs refreshes the
# README's copies in docs/screenshots instead, so a plain test run leaves the tree clean.
_ROOT = Path(__file__).resolve().parents[2]
SHOTS = (
    _ROOT / "docs" / "screenshots"
    if os.environ.get("TETHER_SCREENSHOTS") == "docs"
    else _ROOT / "test-artifacts" / "screenshots"
)

if not CHROMIUM.exists():
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but /usr/bin/chromium is missing (.ci/run installs it)")
    pytest.skip("no /usr/bin/chromium (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
Page = Any  # playwright.sync_api.Page, imported lazily above
expect = sync_api.expect

pytestmark = pytest.mark.slow

APP_SOURCE = '''
import asyncio
import concurrent.futures
import sys

from tether import App, Fail
from tether.config import WorkerConfig

app = App({url!r})


@app.task(name="step")
async def step(ctx, steps=20, delay=0.1, cleanup=0.0):
    """Count to ``steps``, checkpointing each; on a cancel, clean up for ``cleanup`` s."""
    start = (ctx.checkpoint or {{}}).get("step", 0)
    for i in range(start, steps):
        if ctx.cancelled.is_set():
            await asyncio.sleep(cleanup)
            ctx.check_cancelled()
        await asyncio.sleep(delay)
        await ctx.save_checkpoint({{"step": i + 1}})
        ctx.set_progress(i + 1, steps)
    return {{"resumed_from": start, "steps": steps}}


@app.task(name="chatter")
async def chatter(ctx):
    """Logs a line, then runs until it is cancelled, and logs another."""
    ctx.log("waiting to be cancelled")
    await ctx.cancelled.wait()
    ctx.log("cancelled: stopping", level="warning")
    ctx.check_cancelled()


@app.task(name="echo")
async def echo(ctx, **args):
    return args


@app.task(name="explode", max_attempts=1)
async def explode(ctx, message=""):
    raise Fail(message)


@app.task(name="approval")
async def approval(ctx, cost=10):
    """A planned step, then a person's decision, then the costly step if approved."""
    plan = await ctx.step("plan", lambda: {{"cost": cost}})
    decision = await ctx.wait_for("approval")
    if not decision.get("approved"):
        return {{"status": "rejected", "by": decision.get("by")}}
    done = await ctx.step("spend", lambda: plan["cost"])
    return {{"status": "done", "spent": done, "by": decision.get("by")}}


if __name__ == "__main__":
    name, queues = sys.argv[1], tuple(sys.argv[2].split(","))
    config = WorkerConfig(
        name=name, queues=queues, concurrency=4, poll_interval=0.2, heartbeat_interval=0.5,
        lease_duration=3.0, self_fence_margin=1.0, rescue_interval=0.5, cancel_grace=5.0,
        stop_timeout=2.0,
    )
    asyncio.run(app.worker(config).run(handle_signals=True))
'''


@dataclass
class Stack:
    """A running server, its database, tokens and the processes to stop."""

    base: str
    url: str
    cwd: Path
    tokens: dict[str, str]
    procs: list[subprocess.Popen[str]]

    def api(self, method: str, path: str, who: str = "root", **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return httpx.request(method, f"{self.base}{path}", headers=headers, timeout=30, **kw)

    def enqueue(self, task: str, args: dict[str, Any], **opts: Any) -> int:
        res = self.api("POST", "/api/jobs", json={"task": task, "args": args, **opts})
        assert res.status_code == 201, res.text
        job_id: int = res.json()["id"]
        return job_id

    def job(self, job_id: int) -> dict[str, Any]:
        res = self.api("GET", f"/api/jobs/{job_id}")
        assert res.status_code == 200, res.text
        body: dict[str, Any] = res.json()
        return body

    def until(
        self, job_id: int, ok: Callable[[dict[str, Any]], bool], timeout: float = 15
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if ok(job):
                return job
            assert time.monotonic() < deadline, f"job {job_id} never got there: {job}"
            time.sleep(0.1)

    def worker(self, name: str, queues: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "jobs.py", name, queues],
            cwd=self.cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.procs.append(proc)
        return proc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cwd = tmp_path_factory.mktemp("dashboard")
    url = f"sqlite:///{cwd}/tether.db"
    (cwd / "jobs.py").write_text(APP_SOURCE.format(url=url))

    async def make_tokens() -> dict[str, str]:
        app = App(url)
        try:
            return {
                name: (await Tokens(app).create(name, role))[0]
                for name, role in (("root", "admin"), ("eve", "viewer"), ("alice", "member"))
            }
        finally:
            await app.close()

    # In a thread: Playwright's sync API may already run an event loop in this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        tokens = pool.submit(asyncio.run, make_tokens()).result()
    port = free_port()
    server = subprocess.Popen(
        [
            TETHER,
            "serve",
            "--port",
            str(port),
            "--database",
            url,
            "--app",
            "jobs:app",
            "--log-level",
            "warning",
        ],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    st = Stack(f"http://127.0.0.1:{port}", url, cwd, tokens, [server])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{st.base}/health", timeout=1).status_code in (200, 503):
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, "tether serve exited"
            assert time.monotonic() < deadline, "tether serve did not start"
            time.sleep(0.05)
        st.worker("main", "default")
        yield st
    finally:
        for proc in reversed(st.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in st.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, stack: Stack) -> Iterator[Page]:
    context = browser.new_context(base_url=stack.base, viewport={"width": 1360, "height": 900})
    context.set_default_timeout(15_000)
    pg = context.new_page()
    yield pg
    context.close()


def login(page: Page, stack: Stack, who: str = "root") -> None:
    page.goto("/login")
    page.fill("#token", stack.tokens[who])
    page.click("button[type=submit]")
    expect(page.locator("header .who")).to_contain_text(who)


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def state_of(page: Page) -> Any:
    return page.locator("#job-state .state")


def test_login_see_jobs_arrive_live_and_open_one(page: Page, stack: Stack) -> None:
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login$"))
    shot(page, "login")
    login(page, stack)
    cookie = next(c for c in page.context.cookies() if c["name"] == "tether_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert stack.tokens["root"] not in page.content()

    page.goto("/jobs")
    expect(page.locator("#live-status")).to_contain_text("live", timeout=10_000)
    job_id = stack.enqueue("step", {"steps": 5, "delay": 0.05})
    row = page.locator(f"tr[data-job='{job_id}']")
    expect(row).to_be_visible(timeout=10_000)  # arrived over the event stream
    expect(row.locator(".state")).to_have_text("succeeded", timeout=15_000)
    # A little history for the screenshots: a pipeline with a failure and a pause.
    for n in range(3):
        stack.enqueue("step", {"steps": 4, "delay": round(0.05 * (n + 1), 2)})
    stack.enqueue("explode", {"message": "upstream returned HTTP 503"})
    held = stack.enqueue("step", {"steps": 5}, key="tenant-42", delay=3600)
    assert stack.api("POST", f"/api/jobs/{held}/pause").status_code == 200
    stack.enqueue("step", {"steps": 5}, key="tenant-42")
    row.locator("a").first.click()
    expect(page).to_have_url(re.compile(rf"/jobs/{job_id}$"))
    expect(state_of(page)).to_have_text("succeeded")
    expect(page.locator("#job-checkpoint")).to_contain_text('"step": 5')
    expect(page.locator("tr.event")).to_have_count(3)  # queued, running, succeeded
    shot(page, "job")
    time.sleep(1.0)
    page.goto("/jobs")
    expect(page.locator("tr[data-job]").first).to_be_visible()
    shot(page, "jobs")
    page.goto("/queues")
    expect(page.locator("body")).to_contain_text("tenant-42")
    shot(page, "queues")
    page.goto("/demo")
    shot(page, "demo")


def test_a_running_jobs_log_shows_on_its_page_as_it_is_written(page: Page, stack: Stack) -> None:
    login(page, stack)
    job_id = stack.enqueue("chatter", {})
    page.goto(f"/jobs/{job_id}")
    lines = page.locator("#job-log .log-line")
    expect(lines).to_have_count(1, timeout=15_000)  # refreshed in, while it runs
    expect(lines.first).to_contain_text("waiting to be cancelled")
    expect(state_of(page)).to_have_text("running")
    assert stack.api("POST", f"/api/jobs/{job_id}/cancel", json={}).status_code == 200
    expect(state_of(page)).to_have_text("cancelled", timeout=15_000)
    expect(lines).to_have_count(2)
    expect(page.locator("#job-log .log-warning")).to_contain_text("cancelled: stopping")


def test_cancel_a_running_job_through_cancelling_to_cancelled(page: Page, stack: Stack) -> None:
    job_id = stack.enqueue("step", {"steps": 400, "delay": 0.05, "cleanup": 1.5})
    stack.until(job_id, lambda j: j["state"] == "running" and j["progress"]["current"])
    login(page, stack)
    page.goto(f"/jobs/{job_id}")
    expect(state_of(page)).to_have_text("running")
    page.fill("#cancel-form input[name=reason]", "wrong input file")
    page.click("#cancel-form button[type=submit]")
    expect(page.locator(".flash-ok")).to_contain_text(f"cancel of job {job_id} requested")
    expect(state_of(page)).to_have_text("cancelling")
    shot(page, "job-cancelling")
    expect(state_of(page)).to_have_text("cancelled", timeout=15_000)
    expect(page.locator("#cancel-status")).to_have_text("completed", timeout=10_000)
    expect(page.locator("#cancellation")).to_contain_text("wrong input file")
    assert page.locator("#cancellation tr.step").count() >= 2
    page.goto("/cancellations")
    expect(page.locator(".record").first).to_contain_text(f"#{job_id}")
    shot(page, "cancellations")
    audit = stack.api("GET", "/api/audit").json()["items"]
    assert any(
        a["action"] == "job.cancel" and a["target"] == f"job:{job_id}" and a["actor"] == "root"
        for a in audit
    )


def test_pause_and_resume_continue_from_the_checkpoint(page: Page, stack: Stack) -> None:
    job_id = stack.enqueue("step", {"steps": 30, "delay": 0.1})
    stack.until(job_id, lambda j: (j["checkpoint"] or {}).get("step", 0) >= 3)
    login(page, stack)
    page.goto(f"/jobs/{job_id}")
    page.click("form[action$='/pause'] button")
    expect(state_of(page)).to_have_text(re.compile("pausing|paused"))
    expect(state_of(page)).to_have_text("paused", timeout=10_000)
    paused = stack.job(job_id)
    at = paused["checkpoint"]["step"]
    assert 3 <= at < 30
    expect(page.locator("#job-checkpoint")).to_contain_text(f'"step": {at}')
    shot(page, "job-paused")
    page.click("form[action$='/resume'] button")
    expect(page.locator(".flash-ok")).to_contain_text("resumed")
    expect(state_of(page)).to_have_text("succeeded", timeout=15_000)
    result = stack.job(job_id)["result"]
    assert result == {"resumed_from": at, "steps": 30}  # not from step 0


def test_approve_and_reject_a_job_that_waits_for_a_person(page: Page, stack: Stack) -> None:
    approved, rejected = (stack.enqueue("approval", {"cost": 7}) for _ in range(2))
    login(page, stack)
    for job_id in (approved, rejected):
        page.goto(f"/jobs/{job_id}")
        expect(page.locator("#job-waiting")).to_contain_text(
            "waiting for signal 'approval', with no time limit"
        )
        expect(page.locator("#steps .durable-step")).to_have_count(2)
        expect(page.locator("#steps")).to_contain_text("plan")
    page.goto(f"/jobs/{approved}")
    shot(page, "job-waiting-for-approval")
    page.click("#signal-approval button.approve")
    expect(page.locator(".flash-ok")).to_contain_text("approval approved")
    expect(state_of(page)).to_have_text("succeeded", timeout=15_000)
    assert stack.job(approved)["result"] == {"status": "done", "spent": 7, "by": "root"}
    expect(page.locator("#signal-approval")).to_have_count(0)
    expect(page.locator("#steps .durable-step")).to_have_count(3)
    page.goto(f"/jobs/{rejected}")
    page.click("#signal-approval button.danger")
    expect(state_of(page)).to_have_text("succeeded", timeout=15_000)
    assert stack.job(rejected)["result"] == {"status": "rejected", "by": "root"}
    audit = stack.api("GET", "/api/audit", params={"limit": 50}).json()["items"]
    assert any(a["action"] == "job.signal" and a["actor"] == "root" for a in audit)


def test_kill_a_worker_and_see_its_job_rescued(page: Page, stack: Stack) -> None:
    victim = stack.worker("victim", "victims")
    job_id = stack.enqueue("step", {"steps": 300, "delay": 0.1}, queue="victims")
    running = stack.until(job_id, lambda j: j["state"] == "running" and j["progress"]["current"])
    owner = running["lease"]["worker_id"]
    login(page, stack)
    page.goto(f"/jobs/{job_id}")
    expect(page.locator("#lease-owner")).to_have_text(owner)
    page.goto("/workers")
    expect(page.locator(f"tr[data-worker='{owner}']")).to_contain_text(str(victim.pid))
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    page.goto(f"/jobs/{job_id}")
    # The lease (3 s) runs out; the rescuer in the other worker takes the job back.
    expect(page.locator("tr.event", has_text="rescuer")).to_be_visible(timeout=20_000)
    expect(page.locator("#job-attempt")).to_contain_text("1/")
    stack.worker("rescuer", "victims")
    expect(state_of(page)).to_have_text("running", timeout=15_000)
    expect(page.locator("#job-attempt")).to_contain_text("2/")
    expect(page.locator("#lease-owner")).not_to_have_text(owner)
    assert (stack.job(job_id)["checkpoint"] or {}).get("step", 0) > 0
    shot(page, "job-rescued")
    page.goto("/workers")
    expect(page.locator(f"tr[data-worker='{owner}'] .state")).not_to_have_text(
        "active", timeout=10_000
    )
    shot(page, "workers")
    page.goto("/")
    expect(page.locator("#rescued")).not_to_have_text("0")
    shot(page, "overview")
    stack.api("POST", f"/api/jobs/{job_id}/cancel", json={"force": True, "wait": 0})


HOSTILE = {
    "html": "<script>window.__pwned = 'script'</script>",
    "attr": '" onmouseover="window.__pwned=\'attr\'" x="',
    "img": "<img src=x onerror=\"window.__pwned='img'\">",
    "quote": "' onfocus='window.__pwned=1' autofocus '",
}


def test_hostile_args_and_errors_render_inert(page: Page, stack: Stack) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    job_id = stack.enqueue("echo", HOSTILE)
    failed = stack.enqueue("explode", {"message": HOSTILE["html"] + HOSTILE["attr"]})
    stack.until(failed, lambda j: j["state"] == "failed")
    stack.until(job_id, lambda j: j["state"] == "succeeded")
    login(page, stack)
    for path in (f"/jobs/{job_id}", f"/jobs/{failed}", "/jobs", f"/jobs?q={HOSTILE['html']}"):
        page.goto(path)
        page.mouse.move(200, 300)
        page.locator("main").hover()
        for pre in page.locator("pre").all():
            pre.hover()
        time.sleep(0.3)
        assert page.evaluate("window.__pwned") is None, path
        assert page.locator("main script, main img, main [onmouseover]").count() == 0, path
    page.goto(f"/jobs/{job_id}")
    expect(page.locator("#job-args")).to_contain_text("<script>window.__pwned")
    page.goto(f"/jobs/{failed}")
    expect(page.locator("#job-error")).to_contain_text('" onmouseover="')
    assert dialogs == []
    res = httpx.get(f"{stack.base}/login")
    assert "script-src 'self'" in res.headers["content-security-policy"]
    assert "unsafe-inline" not in res.headers["content-security-policy"]


def test_a_viewer_sees_no_buttons_and_cannot_mutate(page: Page, stack: Stack) -> None:
    job_id = stack.enqueue("step", {"steps": 5}, delay=3600)
    login(page, stack, "eve")
    page.goto(f"/jobs/{job_id}")
    expect(state_of(page)).to_have_text("queued")
    assert page.locator("#actions").count() == 0
    assert page.locator("main form[method=post]").count() == 0
    page.goto("/jobs")
    assert page.locator("#bulk button").count() == 0
    page.goto("/queues")
    assert page.locator("main form[method=post]").count() == 0
    # Forge the posts anyway, with the session's own CSRF token (from the logout form).
    csrf = page.locator("header input[name=csrf]").get_attribute("value")
    for action, data in (
        ("cancel", {"reason": "viewer"}),
        ("pause", {}),
        ("delete", {"confirm": "yes"}),
    ):
        res = page.request.post(f"/jobs/{job_id}/{action}", form={"csrf": csrf, **data})
        assert res.status == 403, (action, res.status)
    res = page.request.post("/queues/default/pause", form={"csrf": csrf})
    assert res.status == 403
    res = page.request.post(
        "/jobs/bulk-cancel", form={"csrf": csrf, "ids": str(job_id), "confirm": "yes"}
    )
    assert res.status == 403
    assert stack.job(job_id)["state"] == "queued"
    audit = stack.api("GET", "/api/audit").json()["items"]
    assert any(a["actor"] == "eve" and a["result"] == "denied" for a in audit)


def test_a_post_without_csrf_token_is_refused(stack: Stack) -> None:
    job_id = stack.enqueue("step", {"steps": 5}, delay=3600)
    with httpx.Client(base_url=stack.base, timeout=10) as http:
        # Even logging in needs the login form's token.
        res = http.post("/login", data={"token": stack.tokens["root"]})
        assert res.status_code == 403
        form = http.get("/login")
        nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert nonce is not None
        res = http.post("/login", data={"token": stack.tokens["root"], "csrf": nonce.group(1)})
        assert res.status_code == 303 and "tether_session" in http.cookies
        for data in ({}, {"csrf": "forged"}, {"csrf": ""}):
            res = http.post(f"/jobs/{job_id}/cancel", data={"reason": "csrf", **data})
            assert res.status_code == 403, data
        res = http.post("/logout")
        assert res.status_code == 403
        # The session works: the same POST with its token goes through.
        page = http.get(f"/jobs/{job_id}")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        res = http.post(
            f"/jobs/{job_id}/cancel",
            data={"csrf": token.group(1), "target": f"/jobs/{job_id}/cancel"},
        )
        assert res.status_code == 303
    assert stack.job(job_id)["state"] == "cancelled"


def test_a_live_refresh_between_action_and_redirect_keeps_the_message(stack: Stack) -> None:
    job_id = stack.enqueue("step", {"steps": 5}, delay=3600)
    with httpx.Client(base_url=stack.base, timeout=10) as http:
        form = http.get("/login")
        nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert nonce is not None
        http.post("/login", data={"token": stack.tokens["root"], "csrf": nonce.group(1)})
        page = http.get(f"/jobs/{job_id}")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        res = http.post(
            f"/jobs/{job_id}/pause",
            data={"csrf": token.group(1), "target": f"/jobs/{job_id}/pause"},
        )
        assert res.status_code == 303
        # The old page's live region refreshes before the browser follows the redirect.
        live = http.get(f"/jobs/{job_id}?fragment=1")
        assert live.status_code == 200 and "flash" not in live.text
        shown = http.get(res.headers["location"])
        assert 'class="flash flash-ok"' in shown.text and "paused" in shown.text
        assert 'class="flash' not in http.get(f"/jobs/{job_id}").text  # shown once


def test_a_job_no_worker_serves_is_flagged_on_its_page_and_the_queues_page(
    stack: Stack,
) -> None:
    job_id = stack.enqueue("echo", {}, queue="nowhere")
    why = "no worker serves task echo on queue nowhere"  # then why: no worker, or none there
    with httpx.Client(base_url=stack.base, timeout=10) as http:
        form = http.get("/login")
        nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert nonce is not None
        http.post("/login", data={"token": stack.tokens["eve"], "csrf": nonce.group(1)})
        assert why in http.get(f"/jobs/{job_id}").text
        assert why in http.get("/queues").text
    stack.api("POST", f"/api/jobs/{job_id}/cancel")


def test_bulk_cancel_asks_first_and_is_capped(page: Page, stack: Stack) -> None:
    ids = [stack.enqueue("step", {"steps": 5}, delay=3600, queue="bulk") for _ in range(2)]
    login(page, stack)
    page.goto("/jobs?queue=bulk")
    for job_id in ids:
        page.check(f"input[name=ids][value='{job_id}']")
    page.fill("#bulk input[name=reason]", "duplicate batch")
    page.click("#bulk button[type=submit]")
    expect(page.locator("h1")).to_contain_text("Cancel 2 job(s)?")
    assert all(stack.job(i)["state"] == "queued" for i in ids)  # nothing yet
    page.click("#confirm-bulk")
    expect(page.locator(".flash-ok")).to_contain_text("cancel requested for 2 job(s)")
    assert all(stack.job(i)["state"] == "cancelled" for i in ids)
    csrf = page.locator("header input[name=csrf]").get_attribute("value")
    too_many = "&".join(f"ids={i}" for i in range(1, 60))
    res = page.request.post(
        "/jobs/bulk-cancel",
        data=f"csrf={csrf}&target=/jobs/bulk-cancel&confirm=yes&{too_many}",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert res.ok and "at most 50 jobs" in res.text()


def _store_with_queue(stack: Stack, queue: str, owner: str) -> int:
    """A job in ``queue``, written to the store directly: a name from before the safe
    alphabet (the App refuses it now)."""

    async def write() -> int:
        import dataclasses

        from tether.new_job import new_job
        from tether.task import EnqueueOptions

        app = App(stack.url)
        app.task(name="step")(lambda ctx: None)
        try:
            opts = EnqueueOptions(owner=owner, delay=3600)
            new = new_job(
                app.tasks, "step", {}, opts, max_payload_bytes=app.config.max_payload_bytes
            )
            (job,) = await (await app.store()).enqueue([dataclasses.replace(new, queue=queue)])
            return job.id
        finally:
            await app.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, write()).result()


def test_a_queue_name_cannot_turn_the_pause_button_into_another_action(
    page: Page, stack: Stack
) -> None:
    victim = stack.enqueue("step", {"steps": 5}, delay=3600)
    _store_with_queue(stack, f"../jobs/{victim}", "alice")
    login(page, stack)
    page.goto("/queues")
    row = page.locator("tr", has_text=f"../jobs/{victim}")
    action = row.locator("form").get_attribute("action")
    row.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert stack.job(victim)["state"] == "queued"  # not paused by the admin's click
    assert stack.job(victim)["pause_request"] is None
    assert action == f"/queues/..%2Fjobs%2F{victim}/pause"  # one encoded path segment


def test_a_missing_or_hidden_job_page_is_the_same_404_page(page: Page, stack: Stack) -> None:
    roots = stack.enqueue("step", {"steps": 5}, delay=3600)
    login(page, stack, "alice")
    shown = {}
    for job_id in (roots, 10**12, "²"):
        res = page.goto(f"/jobs/{job_id}")
        assert res is not None and res.status == 404, job_id
        expect(page.locator("nav a.active")).to_have_text("Jobs")
        expect(page.locator("main")).to_contain_text(f"job {job_id} does not exist")
        shown[job_id] = page.content().replace(f"job {job_id} does", "job N does")
    assert shown[roots] == shown[10**12] == shown["²"]
    # Look-alike digits elsewhere are no numbers either: no 500.
    csrf = page.locator("header input[name=csrf]").get_attribute("value")
    res = page.request.post(
        "/jobs/bulk-cancel", form={"csrf": csrf, "target": "/jobs/bulk-cancel", "ids": "²"}
    )
    assert res.ok and "select at least one job" in res.text()
