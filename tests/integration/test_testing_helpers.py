"""tether.testing: the in-memory database, run_until_idle, task.call and tether_app."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import tether
from tether import App, Cancelled, JobContext, SyncJobContext, Workflow
from tether.testing import MEMORY_URL, TestContext


async def test_memory_database_is_shared_by_the_apps_connections_and_private_to_it() -> None:
    app, other = App(MEMORY_URL), App(MEMORY_URL)

    @app.task(name="echo")
    async def echo(ctx: JobContext, text: str) -> str:
        return text

    job = await echo.enqueue(text="hi")
    # The portal loop has a store (a connection) of its own: it sees the same database.
    seen = await asyncio.to_thread(lambda: app.run_sync(app.get(job.id)))
    assert seen.args == {"text": "hi"}
    assert await other.jobs.list() == []
    await app.close()
    await asyncio.to_thread(lambda: app.run_sync(app.close()))
    await other.close()


async def test_memory_database_serves_several_loops_at_once_without_lock_errors() -> None:
    app = App(MEMORY_URL)

    @app.task(name="echo")
    async def echo(ctx: JobContext, i: int) -> int:
        return i

    def from_sync_code() -> None:
        for i in range(50):
            echo.enqueue_sync(i=i)  # the portal loop's store
            app.run_sync(app.jobs.list(limit=5))

    await asyncio.gather(
        asyncio.to_thread(from_sync_code),
        *(echo.enqueue(i=i) for i in range(50)),
        *(app.jobs.stats() for _ in range(50)),
    )
    assert len(await app.run_until_idle()) == 100
    await app.close()
    await asyncio.to_thread(lambda: app.run_sync(app.close()))


async def test_run_until_idle_runs_due_jobs_and_what_they_make_due_and_leaves_the_rest(
    tether_app: App,
) -> None:
    app = tether_app
    ran: list[str] = []

    @app.task(name="step")
    async def step(ctx: JobContext, name: str) -> str:
        ran.append(name)
        if name == "parent" and ctx.phase is None:
            await ctx.spawn("step", name="child")
            raise tether.WaitForChildren()  # runs again once the child is done
        return name

    @app.task(
        name="flaky", max_attempts=2, retry=tether.RetryPolicy(base_delay=3600, max_delay=3600)
    )
    async def flaky(ctx: JobContext) -> None:
        raise RuntimeError("down")

    flow = Workflow()
    flow.add("first", step, {"name": "first"})
    flow.add("second", step, {"name": "second"}, depends_on=["first"])
    await app.enqueue_workflow(flow)
    await step.enqueue(name="parent")
    later = await step.options(delay=3600).enqueue(name="later")
    retried = await flaky.enqueue()

    done = await app.run_until_idle()
    by_name = {j.result or j.task: j.state.value for j in done}
    assert sorted(ran) == ["child", "first", "parent", "parent", "second"]
    assert by_name == {
        "first": "succeeded",
        "parent": "succeeded",
        "flaky": "retrying",
        "second": "succeeded",
        "child": "succeeded",
    }
    assert (await app.get(later.id)).state.value == "queued"
    assert (await app.get(retried.id)).state.value == "retrying"
    assert await app.run_until_idle() == []


def test_run_until_idle_sync_runs_thread_handlers_from_sync_tests(tether_app: App) -> None:
    @tether_app.task(name="double")
    def double(ctx: SyncJobContext, n: int) -> int:
        return n * 2

    job = double.enqueue_sync(n=21)
    [done] = tether_app.run_until_idle_sync()
    assert (done.id, done.state.value, done.result) == (job.id, "succeeded", 42)


async def test_task_call_runs_the_handler_with_an_observable_test_context() -> None:
    app = App(MEMORY_URL)

    @app.task(name="crawl")
    async def crawl(ctx: JobContext, pages: int) -> int:
        done = (ctx.checkpoint or {}).get("pages", 0)
        for page in range(done, pages):
            ctx.check_cancelled()
            await ctx.save_checkpoint({"pages": page + 1})
            ctx.set_progress(page + 1, pages)
            await ctx.spawn("crawl", pages=0)
        return pages

    assert await crawl.call(pages=2) == 2

    ctx = TestContext(checkpoint={"pages": 1})
    assert await ctx.run(crawl, pages=3) == 3
    assert ctx.checkpoints == [{"pages": 2}, {"pages": 3}]
    assert ctx.progress == (3, 3)
    assert ctx.spawned == [("crawl", {"pages": 0}), ("crawl", {"pages": 0})]

    cancelled = TestContext()
    cancelled.cancel()
    with pytest.raises(Cancelled):
        await cancelled.run(crawl, pages=3)
    assert cancelled.checkpoints == []

    with pytest.raises(tether.InvalidJobError, match="valid integer"):
        await crawl.call(pages="many")  # type: ignore[arg-type]


async def test_a_test_context_cancelled_during_the_run_stops_the_handler() -> None:
    app = App(MEMORY_URL)
    started = asyncio.Event()

    @app.task(name="wait")
    async def wait(ctx: JobContext) -> str:
        started.set()
        await ctx.cancelled.wait()
        return f"stopped: {ctx.cancelled.reason}"

    ctx = TestContext()
    running = asyncio.create_task(ctx.run(wait))
    await started.wait()
    ctx.cancel()
    assert await running == "stopped: cancel"


async def test_task_call_runs_a_thread_handler_with_the_blocking_context() -> None:
    app = App(MEMORY_URL)
    seen: list[Any] = []

    @app.task(name="work")
    def work(ctx: SyncJobContext, n: int) -> int:
        ctx.save_checkpoint({"n": n})
        seen.append(ctx.cancelled.is_set())
        return n + 1

    ctx = TestContext()
    assert await ctx.run(work, n=1) == 2
    assert (ctx.checkpoints, seen) == ([{"n": 1}], [False])


async def test_a_test_context_runs_durable_steps_in_memory() -> None:
    app = App(MEMORY_URL)
    fetched: list[str] = []

    @tether.step()
    async def fetch(url: str) -> str:
        fetched.append(url)
        return url.upper()

    @app.task
    async def agent(ctx: JobContext) -> list[Any]:
        plan = await ctx.step("plan", lambda: ["a", "b"])
        pages = [await fetch(u) for u in ["x"]]
        await ctx.sleep(60)
        verdict = await ctx.wait_for("approval")
        return [plan, pages, verdict]

    # As a later attempt: "plan" was done before, the approval came.
    ctx = TestContext(steps={"plan": ["p"]}, signals={"approval": True})
    assert await ctx.run(agent) == [["p"], ["X"], True]
    assert ctx.steps_run == ["test_a_test_context_runs_durable_steps_in_memory.<locals>.fetch"]
    assert ctx.sleeps == [60] and fetched == ["x"]

    waiting = TestContext()
    with pytest.raises(tether.InvalidJobError, match="signals="):
        await waiting.run(agent)


def test_a_test_context_runs_a_thread_handlers_steps() -> None:
    app = App(MEMORY_URL)

    @app.task
    def sync_agent(ctx: SyncJobContext) -> int:
        return int(ctx.step("one", lambda: 1)) + int(ctx.step("two", lambda: 2))

    ctx = TestContext(steps={"one": 10})
    assert asyncio.run(ctx.run(sync_agent)) == 12
    assert ctx.steps_run == ["two"]
