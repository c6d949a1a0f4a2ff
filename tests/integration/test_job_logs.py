"""A job's own log, written by real workers on both stores: ``ctx.log`` and the
``logging`` module inside async and thread handlers, read back in order; lines of a
running job show up before it ends, and every line is in before its outcome."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest

import tether
from tests.helpers import eventually
from tests.integration.control_support import StartWorker
from tether import App, AppConfig, JobState
from tether.joblog import DROPPED
from tether.testing import TestContext

USER_LOG = "shop.orders"


@pytest.fixture
def user_logger() -> Iterator[logging.Logger]:
    """A logger of the user's, let through at INFO whatever the root's level."""
    logger = logging.getLogger(USER_LOG)
    before = logger.level
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(before)


async def test_an_async_handler_logs_through_ctx_and_the_logging_module(
    app: App, workers: StartWorker, user_logger: logging.Logger
) -> None:
    @app.task
    async def order(ctx: tether.JobContext, n: int) -> None:
        ctx.log(f"order {n}: start")
        user_logger.info("order %d: charged", n)
        logging.getLogger("tether.worker").warning("the worker's own line, not the job's")
        user_logger.debug("below the logger's level: never emitted")
        try:
            raise ValueError("card declined")
        except ValueError:
            user_logger.exception("order %d: retrying the card", n)
        ctx.log("done", level="warning")

    await workers()
    job = await order.enqueue(n=7)
    assert (await app.wait(job.id, timeout=10)).state is JobState.SUCCEEDED
    # The outcome is written after the lines: nothing to wait for once it is in.
    lines = await app.jobs.logs(job.id)
    assert [(x.seq, x.level) for x in lines] == [
        (1, "info"),
        (2, "info"),
        (3, "error"),
        (4, "warning"),
    ]
    assert [x.message.splitlines()[0] for x in lines] == [
        "order 7: start",
        "order 7: charged",
        "order 7: retrying the card",
        "done",
    ]
    assert "ValueError: card declined" in lines[2].message  # the traceback travels
    assert all(x.attempt == 1 for x in lines)
    assert [x.message for x in await app.jobs.logs(job.id, after=2)][-1] == "done"


async def test_a_thread_handler_logs_through_ctx_and_the_logging_module(
    app: App, workers: StartWorker, user_logger: logging.Logger
) -> None:
    @app.task(executor="thread")
    def report(ctx: tether.SyncJobContext) -> None:
        ctx.log("from the thread")
        user_logger.warning("thread %s", threading.current_thread().name != "MainThread")

    await workers()
    job = await report.enqueue()
    assert (await app.wait(job.id, timeout=10)).state is JobState.SUCCEEDED
    lines = await app.jobs.logs(job.id)
    assert [(x.level, x.message) for x in lines] == [
        ("info", "from the thread"),
        ("warning", "thread True"),
    ]


async def test_a_running_jobs_lines_show_before_it_ends(app: App, workers: StartWorker) -> None:
    release = asyncio.Event()

    @app.task
    async def long(ctx: tether.JobContext) -> None:
        ctx.log("first")
        await release.wait()
        ctx.log("last")

    await workers()
    job = await long.enqueue()

    async def first() -> list[tether.joblog.LogLine]:
        return await app.jobs.logs(job.id)

    [line] = await eventually(first)
    assert line.message == "first"
    assert (await app.get(job.id)).state is JobState.RUNNING
    release.set()
    assert (await app.wait(job.id, timeout=10)).state is JobState.SUCCEEDED
    assert [x.message for x in await app.jobs.logs(job.id)] == ["first", "last"]


@pytest.fixture
def small_log() -> AppConfig:
    return AppConfig(job_log_max_lines=3, wait_poll_interval=0.05)


async def test_a_chatty_job_keeps_its_first_lines_and_counts_the_rest(
    db_url: str, small_log: AppConfig
) -> None:
    from tests.helpers import fast_config

    app = App(db_url, config=small_log)

    @app.task
    async def chatty(ctx: tether.JobContext) -> None:
        for i in range(10):
            ctx.log(f"line {i}")

    worker = tether.Worker(app, fast_config())
    await worker.start()
    try:
        job = await chatty.enqueue()
        assert (await app.wait(job.id, timeout=10)).state is JobState.SUCCEEDED
        lines = await app.jobs.logs(job.id)
        assert [x.message for x in lines[:3]] == ["line 0", "line 1", "line 2"]
        assert (lines[3].level, lines[3].dropped) == (DROPPED, 7)
        assert len(lines) == 4
    finally:
        await worker.stop()
        await app.close()


async def test_a_deleted_job_takes_its_lines_along(app: App, workers: StartWorker) -> None:
    @app.task
    async def quick(ctx: tether.JobContext) -> None:
        ctx.log("kept until the job goes")

    await workers()
    job = await quick.enqueue()
    await app.wait(job.id, timeout=10)
    assert len(await app.jobs.logs(job.id)) == 1
    await app.jobs.delete(job.id)
    store = await app.store()
    assert await store.logs(job.id) == []


async def test_a_test_context_keeps_the_lines(user_logger: logging.Logger) -> None:
    app = App("sqlite://:memory:")

    @app.task
    async def order(ctx: tether.JobContext) -> None:
        ctx.log("by ctx")
        user_logger.info("by logging")

    @app.task(executor="thread")
    def sync_order(ctx: tether.SyncJobContext) -> None:
        ctx.log("by ctx", level="error")
        user_logger.info("by logging")

    ctx = TestContext()
    await ctx.run(order)
    assert [(x.level, x.message) for x in ctx.logs] == [("info", "by ctx"), ("info", "by logging")]
    ctx = TestContext()
    await ctx.run(sync_order)
    assert [(x.level, x.message) for x in ctx.logs] == [
        ("error", "by ctx"),
        ("info", "by logging"),
    ]
    await app.close()


async def test_a_process_handler_logs_through_its_pipe(app: App, workers: StartWorker) -> None:
    from tests.integration.proc_tasks import register

    tasks = register(app, max_attempts=1)
    await workers()
    job = await tasks["logs"].enqueue()
    assert (await app.wait(job.id, timeout=60)).state is JobState.SUCCEEDED
    lines = await app.jobs.logs(job.id)
    assert [(x.level, x.message) for x in lines] == [
        ("info", "from process True"),
        ("warning", "a warning"),
    ]


async def test_the_byte_bound_keeps_a_prefix_of_the_lines(db_url: str) -> None:
    from tests.helpers import fast_config

    app = App(db_url, config=AppConfig(job_log_max_bytes=10, wait_poll_interval=0.05))

    @app.task
    async def wordy(ctx: tether.JobContext) -> None:
        for message in ("ééé", "abcd", "a line too many", "x"):  # 6 + 4 bytes fill it
            ctx.log(message)

    worker = tether.Worker(app, fast_config())
    await worker.start()
    try:
        job = await wordy.enqueue()
        assert (await app.wait(job.id, timeout=10)).state is JobState.SUCCEEDED
        lines = await app.jobs.logs(job.id)
        assert [x.message for x in lines[:2]] == ["ééé", "abcd"]
        assert (lines[2].level, lines[2].dropped, len(lines)) == (DROPPED, 2, 3)
    finally:
        await worker.stop()
        await app.close()
