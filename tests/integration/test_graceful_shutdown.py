"""Graceful shutdown on both stores (seed 002's "Closing": TestGRACEShutdownFlow,
TestGRACECheckpointSaving and TestGRACEWorkerShutdownTimeout, in tether form).

``worker.stop()`` claims nothing more, lets short jobs finish, and after
``stop_timeout`` releases what still runs to ``queued`` with its checkpoint and without
spending an attempt, even a handler that ignores being stopped; the next worker resumes
from the checkpoint."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.helpers import eventually, fast_config
from tests.integration.workflow_support import in_state
from tether import App, JobContext, JobState, SyncJobContext, Worker

STOP_TIMEOUT = 1.0
CANCEL_GRACE = 0.3


async def test_stop_finishes_short_jobs_and_releases_long_ones_within_stop_timeout(
    app: App,
) -> None:
    short_gate = asyncio.Event()
    hang = asyncio.Event()  # what the stubborn handler waits for once it was stopped
    reached = {"polite": asyncio.Event(), "stubborn": asyncio.Event()}
    starts: dict[str, list[int]] = {}
    steps: list[tuple[str, int, int]] = []

    @app.task(max_attempts=1)
    async def short(ctx: JobContext, name: str) -> str:
        await short_gate.wait()
        await asyncio.sleep(0.1)  # still running when the stop begins
        return name

    @app.task(max_attempts=1)
    async def long(ctx: JobContext, name: str, total: int) -> int:
        start = (ctx.checkpoint or {}).get("next", 0)
        starts.setdefault(name, []).append(start)
        first_run = len(starts[name]) == 1
        for i in range(start, total):
            ctx.check_cancelled()  # a task boundary
            steps.append((name, ctx.attempt, i))
            await ctx.save_checkpoint({"next": i + 1})
            if first_run and i == 2:
                reached[name].set()
                if name == "polite":
                    await asyncio.sleep(30)  # far longer than stop_timeout
                else:
                    try:
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        await hang.wait()  # ignores being stopped
                        return -1
        return total

    first = Worker(app, fast_config(stop_timeout=STOP_TIMEOUT, cancel_grace=CANCEL_GRACE))
    await first.start()
    shorts = [await short.enqueue(name=f"short{i}") for i in range(2)]
    polite = await long.enqueue(name="polite", total=5)
    stubborn = await long.enqueue(name="stubborn", total=5)
    try:
        for name in reached:
            await asyncio.wait_for(reached[name].wait(), 10)
        for job in shorts:
            await eventually(lambda job=job: in_state(app, job.id, JobState.RUNNING))

        loop = asyncio.get_running_loop()
        began = loop.time()
        stopping = asyncio.create_task(first.stop())
        await asyncio.sleep(0)  # the stop has begun: nothing is claimed any more
        late = await short.enqueue(name="late")
        short_gate.set()
        await stopping
        took = loop.time() - began

        assert STOP_TIMEOUT <= took < STOP_TIMEOUT + CANCEL_GRACE + 2.0, took
        assert not first.running
        for job in shorts:
            done = await app.get(job.id)
            assert (done.state, done.result) == (JobState.SUCCEEDED, job.args["name"])
        for job, stopped_by in ((polite, "task_cancelled"), (stubborn, "abandoned")):
            released = await app.get(job.id)
            assert released.state is JobState.QUEUED
            assert released.checkpoint == {"next": 3}, "the checkpoint is kept"
            assert released.attempt == 0, "a release does not spend an attempt"
            assert released.stopped_by == stopped_by
            assert released.lease_expires_at is None
            last = (await app.jobs.events(job.id))[-1]
            assert (last.from_state, last.to_state, last.reason) == (
                JobState.RUNNING,
                JobState.QUEUED,
                "released at worker shutdown",
            )
        untouched = await app.get(late.id)
        assert (untouched.state, untouched.attempt) == (JobState.QUEUED, 0)
        (info,) = [w for w in await app.admin.workers() if w.id == first.id]
        assert info.state == "stopped"

        second = Worker(app, fast_config())
        await second.start()
        try:
            for job in (polite, stubborn):
                done = await app.wait(job.id, timeout=10)
                assert (done.state, done.result, done.attempt) == (JobState.SUCCEEDED, 5, 1)
            assert (await app.wait(late.id, timeout=10)).state is JobState.SUCCEEDED
        finally:
            await second.stop()
        assert starts == {"polite": [0, 3], "stubborn": [0, 3]}, "resumed from the checkpoint"
        for name in ("polite", "stubborn"):
            assert [i for n, _, i in steps if n == name] == [0, 1, 2, 3, 4], "no step redone"
            assert {a for n, a, i in steps if n == name and i >= 3} == {1}
    finally:
        hang.set()
        short_gate.set()
        await first.stop()


async def test_second_stop_request_releases_running_jobs_at_once(app: App) -> None:
    reached = asyncio.Event()

    @app.task(max_attempts=1)
    async def long(ctx: JobContext) -> object:
        if ctx.checkpoint is None:
            await ctx.save_checkpoint({"step": 1})
            reached.set()
            await asyncio.sleep(30)
        return ctx.checkpoint

    worker = Worker(app, fast_config(stop_timeout=30.0))
    await worker.start()
    job = await long.enqueue()
    await asyncio.wait_for(reached.wait(), 10)
    loop = asyncio.get_running_loop()
    began = loop.time()
    worker.request_stop()  # SIGTERM: a graceful stop with 30 s for running jobs
    await asyncio.sleep(0.05)
    worker.request_stop()  # a second SIGTERM: stop now
    await asyncio.wait_for(worker.stop(), 10)
    assert loop.time() - began < 5.0
    released = await app.get(job.id)
    assert (released.state, released.checkpoint, released.attempt) == (
        JobState.QUEUED,
        {"step": 1},
        0,
    )

    again = Worker(app, fast_config())
    await again.start()
    try:
        done = await app.wait(job.id, timeout=10)
    finally:
        await again.stop()
    assert (done.state, done.result, done.attempt) == (JobState.SUCCEEDED, {"step": 1}, 1)


@pytest.mark.parametrize("executor", ["async", "thread"])
async def test_handler_sees_stopping_at_once_checkpoints_and_resumes_unspent(
    app: App, executor: str
) -> None:
    """The stop is heard when it begins (``ctx.cancelled`` still unset): the handler saves
    a checkpoint and steps aside; the job goes back to ``queued`` unspent, and its next
    attempt starts from that checkpoint."""
    seen: list[tuple[int, object, bool]] = []  # (attempt, checkpoint, cancelled when stopping)
    reached = threading.Event()

    def record(ctx: JobContext | SyncJobContext) -> None:
        seen.append((ctx.attempt, ctx.checkpoint, ctx.cancelled.is_set()))

    if executor == "async":

        @app.task(name="steps", max_attempts=1)
        async def steps_async(ctx: JobContext) -> object:
            if ctx.checkpoint is not None:
                record(ctx)
                return ctx.checkpoint
            reached.set()
            await ctx.stopping.wait()
            record(ctx)
            await ctx.save_checkpoint({"saved": "after the stop began"})
            ctx.check_stopping()
            return "not reached"

    else:

        @app.task(name="steps", max_attempts=1)
        def steps_thread(ctx: SyncJobContext) -> object:
            if ctx.checkpoint is not None:
                record(ctx)
                return ctx.checkpoint
            reached.set()
            assert ctx.stopping.wait_sync(30)
            record(ctx)
            ctx.save_checkpoint({"saved": "after the stop began"})
            ctx.check_stopping()
            return "not reached"

    # stop_timeout far beyond the test's own limits: the job can only be released
    # early because its handler heard of the stop and ended itself.
    first = Worker(app, fast_config(stop_timeout=300.0))
    await first.start()
    job = await app.enqueue("steps")
    try:
        await asyncio.to_thread(reached.wait, 10)
        first.request_stop()  # what SIGTERM does
        await asyncio.wait_for(first.stop(), 60)
    finally:
        await first.stop()
    assert seen == [(1, None, False)], "stopping was seen before any cancel"
    released = await app.get(job.id)
    assert (released.state, released.checkpoint, released.attempt) == (
        JobState.QUEUED,
        {"saved": "after the stop began"},
        0,
    ), "released with the checkpoint saved after the stop began, attempt not spent"
    # (A claim already out when the stop began may have taken it again and handed it
    # back unstarted: that is a later event.)
    assert (JobState.RUNNING, JobState.QUEUED, "released at worker shutdown") in [
        (e.from_state, e.to_state, e.reason) for e in await app.jobs.events(job.id)
    ]

    second = Worker(app, fast_config())
    await second.start()
    try:
        done = await app.wait(job.id, timeout=10)
    finally:
        await second.stop()
    assert (done.state, done.result, done.attempt) == (
        JobState.SUCCEEDED,
        {"saved": "after the stop began"},
        1,
    )
    assert seen[1] == (1, {"saved": "after the stop began"}, False)


async def test_handler_that_keeps_running_after_its_stop_checkpoint_is_released_with_it(
    app: App,
) -> None:
    """A handler that checkpoints when the stop begins but does not end (it is cancelled
    at ``stop_timeout``) is released with that checkpoint all the same."""
    reached = asyncio.Event()

    @app.task(max_attempts=1)
    async def long(ctx: JobContext) -> object:
        if ctx.checkpoint is not None:
            return ctx.checkpoint
        reached.set()
        await ctx.stopping.wait()
        await ctx.save_checkpoint({"step": "saved while stopping"})
        await asyncio.sleep(3600)  # cancelled at stop_timeout
        return None

    worker = Worker(app, fast_config(stop_timeout=STOP_TIMEOUT, cancel_grace=CANCEL_GRACE))
    await worker.start()
    job = await long.enqueue()
    try:
        await asyncio.wait_for(reached.wait(), 10)
        worker.request_stop()
        await asyncio.wait_for(worker.stop(), 30)
    finally:
        await worker.stop()
    released = await app.get(job.id)
    assert (released.state, released.checkpoint, released.attempt, released.stopped_by) == (
        JobState.QUEUED,
        {"step": "saved while stopping"},
        0,
        "task_cancelled",
    )
