"""Hooks around enqueue and execution, and on outcomes, run by real workers on both
stores; a hook that fails never loses a job or changes its outcome."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

import tether
from tests.integration.control_support import StartWorker, rescued_job
from tether import App, Enqueueing, Hook, JobState, OutcomeEvent
from tether.hooks import Hooks
from tether.metrics import HOOK_ERRORS

CURRENT_SPAN: contextvars.ContextVar[str | None] = contextvars.ContextVar("span", default=None)


class Recorder(Hook):
    """Records what each hook method saw."""

    def __init__(self) -> None:
        self.enqueued: list[list[str]] = []
        self.executed: list[tuple[int, str]] = []
        self.outcomes: list[OutcomeEvent] = []
        self.heard = asyncio.Event()

    async def enqueue(
        self, jobs: Sequence[Enqueueing], call_next: Callable[[], Awaitable[list[tether.Job]]]
    ) -> list[tether.Job]:
        self.enqueued.append([j.task.rsplit(".", 1)[-1] for j in jobs])
        return await call_next()

    async def execute(self, ctx: tether.JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        token = CURRENT_SPAN.set(f"span-of-{ctx.id}")
        try:
            value = await call_next()
        except Exception as exc:
            self.executed.append((ctx.id, f"raised {type(exc).__name__}"))
            raise
        finally:
            CURRENT_SPAN.reset(token)
        self.executed.append((ctx.id, f"returned {value!r}"))
        return value

    async def outcome(self, event: OutcomeEvent) -> None:
        self.outcomes.append(event)
        self.heard.set()


def _errors(hook: str, phase: str) -> float:
    return HOOK_ERRORS.labels(hook, phase)._value.get()


async def _heard(recorder: Recorder, kind: str, job_id: int) -> OutcomeEvent:
    """The outcome event of ``kind`` for the job, once a hook heard it."""
    for _ in range(200):
        for event in recorder.outcomes:
            if event.kind == kind and event.job.id == job_id:
                return event
        recorder.heard.clear()
        await asyncio.wait_for(recorder.heard.wait(), 10)
    raise AssertionError(f"no {kind} outcome for job {job_id}")


async def test_execution_hooks_wrap_async_and_thread_handlers_and_their_context(
    app: App,
) -> None:
    recorder = Recorder()
    app.hooks = Hooks([recorder])
    seen: list[str | None] = []

    @app.task
    async def async_job(ctx: tether.JobContext) -> str:
        seen.append(CURRENT_SPAN.get())
        return "a"

    @app.task
    def thread_job(ctx: tether.SyncJobContext) -> str:
        seen.append(CURRENT_SPAN.get())
        return "t"

    a = await async_job.enqueue()
    t = await thread_job.enqueue()
    assert recorder.enqueued == [["async_job"], ["thread_job"]]
    await app.run_until_idle()
    assert (await app.get(a.id)).result == "a"
    assert (await app.get(t.id)).result == "t"
    # The hook's context variable is the handler's, in its task and in its thread.
    assert sorted(s or "" for s in seen) == sorted([f"span-of-{a.id}", f"span-of-{t.id}"])
    assert sorted(recorder.executed) == sorted([(a.id, "returned 'a'"), (t.id, "returned 't'")])


async def test_outcome_hooks_hear_success_retry_exhaustion_and_cancellation(
    app: App, workers: StartWorker
) -> None:
    recorder = Recorder()
    app.hooks = Hooks([recorder])
    started = asyncio.Event()

    @app.task
    async def fine(ctx: tether.JobContext) -> int:
        return 1

    @app.task(max_attempts=2, retry=tether.RetryPolicy(base_delay=0.01, max_delay=0.01))
    async def flaky(ctx: tether.JobContext) -> None:
        raise RuntimeError(f"boom {ctx.attempt}")

    @app.task
    async def long(ctx: tether.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        raise tether.Cancelled("stopping as asked")

    ok = await fine.enqueue()
    bad = await flaky.enqueue()
    await workers()
    assert (await _heard(recorder, "succeeded", ok.id)).job.state is JobState.SUCCEEDED
    failed = await _heard(recorder, "failed", bad.id)
    assert failed.job.state is JobState.RETRYING and "boom 1" in (failed.error or "")
    exhausted = await _heard(recorder, "exhausted", bad.id)
    assert exhausted.job.state is JobState.FAILED and "boom 2" in (exhausted.error or "")

    running = await long.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    result = await app.cancel(running.id, reason="operator said so", wait=10)
    assert result.outcome == "cancelled"
    event = await _heard(recorder, "cancelled", running.id)
    assert event.job.state is JobState.CANCELLED
    assert [e.kind for e in recorder.outcomes].count("cancelled") == 1, "told once"

    # A job cancelled before it ran is told of by the App that cancelled it.
    waiting = await app.enqueue(fine, delay=3600)
    result = await app.cancel(waiting.id, reason="not needed")
    event = await _heard(recorder, "cancelled", waiting.id)
    assert event.reason == "not needed"
    assert event.cancellation_id == result.cancellation_id


async def test_a_rescued_job_is_told_to_the_outcome_hooks(app: App) -> None:
    recorder = Recorder()
    app.hooks = Hooks([recorder])
    async with rescued_job(app, "victim") as job:
        event = await _heard(recorder, "rescued", job.id)
    assert event.job.state is JobState.RETRYING


class Broken(Hook):
    """Fails in every way a hook can, at a chosen moment."""

    def __init__(self, when: str) -> None:
        self.when = when

    async def enqueue(
        self, jobs: Sequence[Enqueueing], call_next: Callable[[], Awaitable[list[tether.Job]]]
    ) -> list[tether.Job]:
        if self.when == "before":
            raise RuntimeError("hook bug before")
        made = await call_next()
        raise RuntimeError("hook bug after")
        return made  # pragma: no cover

    async def execute(self, ctx: tether.JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        if self.when == "before":
            raise RuntimeError("hook bug before")
        if self.when == "swallow":
            try:
                return await call_next()
            except Exception:
                return "swallowed"
        await call_next()
        raise RuntimeError("hook bug after")

    async def outcome(self, event: OutcomeEvent) -> None:
        raise RuntimeError("hook bug in outcome")


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_hook_that_raises_loses_no_job_and_changes_no_outcome(
    app: App, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    app.hooks = Hooks([Broken(when), recorder])

    @app.task
    async def job_task(ctx: tether.JobContext) -> str:
        return "result"

    enqueue_errors = _errors("Broken", "enqueue")
    outcome_errors = _errors("Broken", "outcome")
    with caplog.at_level(logging.ERROR, logger="tether.hooks"):
        job = await job_task.enqueue()
        assert (await app.get(job.id)).state is JobState.QUEUED, "the job is written"
        await app.run_until_idle()
        done = await app.get(job.id)
        await _heard(recorder, "succeeded", job.id)
    assert done.state is JobState.SUCCEEDED and done.result == "result"
    assert _errors("Broken", "enqueue") == enqueue_errors + 1
    assert _errors("Broken", "execute") >= 1
    assert _errors("Broken", "outcome") == outcome_errors + 1
    assert "hook Broken failed in enqueue" in caplog.text
    assert f"hook Broken failed in execute (job {job.id})" in caplog.text


async def test_a_hook_that_swallows_the_handlers_error_does_not_make_it_succeed(
    app: App,
) -> None:
    app.hooks = Hooks([Broken("swallow")])

    @app.task(max_attempts=1)
    async def failing(ctx: tether.JobContext) -> None:
        raise ValueError("the real error")

    job = await failing.enqueue()
    await app.run_until_idle()
    done = await app.get(job.id)
    assert done.state is JobState.FAILED
    assert "the real error" in (done.error or "")


async def test_an_enqueue_hook_refuses_and_nothing_is_written(app: App) -> None:
    class Gate(Hook):
        async def enqueue(
            self,
            jobs: Sequence[Enqueueing],
            call_next: Callable[[], Awaitable[list[tether.Job]]],
        ) -> list[tether.Job]:
            if any(j.task.endswith("forbidden") for j in jobs):
                raise tether.EnqueueRefused("forbidden is closed today")
            return await call_next()

    app.hooks = Hooks([Gate()])

    @app.task
    async def allowed(ctx: tether.JobContext) -> None: ...

    @app.task
    async def forbidden(ctx: tether.JobContext) -> None: ...

    with pytest.raises(tether.EnqueueRefused, match="closed today"):
        await app.enqueue_many([(allowed, {}), (forbidden, {})])
    assert await app.jobs.list() == [], "the whole enqueue is refused"
    assert (await allowed.enqueue()).state is JobState.QUEUED


async def test_hooks_run_around_a_spawn_and_a_handlers_retry_steering_stands(
    app: App,
) -> None:
    recorder = Recorder()

    class Steer(Hook):
        async def execute(
            self, ctx: tether.JobContext, call_next: Callable[[], Awaitable[Any]]
        ) -> Any:
            try:
                return await call_next()
            except KeyError as exc:
                raise tether.Fail(f"no such key: {exc}") from exc

    app.hooks = Hooks([recorder, Steer()])

    @app.task
    async def child(ctx: tether.JobContext) -> None: ...

    @app.task
    async def parent(ctx: tether.JobContext) -> int:
        made = await ctx.spawn(child)
        return made.id

    @app.task(max_attempts=3)
    async def lookup(ctx: tether.JobContext) -> None:
        raise KeyError("k")

    job = await parent.enqueue()
    steered = await lookup.enqueue()
    await app.run_until_idle()
    assert (await app.get(job.id)).state is JobState.SUCCEEDED
    assert recorder.enqueued == [["parent"], ["lookup"], ["child"]]
    done = await app.get(steered.id)
    # Fail from a hook is its deliberate answer: no retry.
    assert done.state is JobState.FAILED and done.attempt == 1
    assert "no such key" in (done.error or "")


def test_a_hook_must_be_a_hook() -> None:
    with pytest.raises(TypeError, match=r"subclass tether\.Hook"):
        Hooks([object()])  # type: ignore[list-item]


async def test_a_hook_that_stalls_holds_no_job_for_ever(app: App, workers: StartWorker) -> None:
    """An execution hook that never calls on is cancelled with its job; an outcome hook
    that never returns does not hold the worker's stop past its bound."""
    stalled = asyncio.Event()

    class Stall(Hook):
        async def execute(
            self, ctx: tether.JobContext, call_next: Callable[[], Awaitable[Any]]
        ) -> Any:
            stalled.set()
            await asyncio.Event().wait()  # never calls on

        async def outcome(self, event: OutcomeEvent) -> None:
            await asyncio.Event().wait()

    app.hooks = Hooks([Stall()])

    @app.task
    async def never_runs(ctx: tether.JobContext) -> None:
        raise AssertionError("the hook never lets it start")

    job = await never_runs.enqueue()
    worker = await workers()
    await asyncio.wait_for(stalled.wait(), 10)
    result = await app.cancel(job.id, reason="stuck in a hook", wait=10)
    assert result.outcome == "cancelled"
    assert (await app.get(job.id)).state is JobState.CANCELLED
    # Its outcome hook is stuck for ever; the stop is bounded all the same.
    await asyncio.wait_for(worker.stop(), 15)


async def test_execution_hooks_wrap_a_process_handler_and_see_its_crash(app: App) -> None:
    from tests.integration.proc_tasks import register

    recorder = Recorder()
    app.hooks = Hooks([recorder])
    tasks = register(app, max_attempts=1)
    ok = await tasks["add_with_checkpoint"].enqueue(a=2, b=3)
    crashed = await tasks["crash"].enqueue()
    await app.run_until_idle()
    assert (await app.get(ok.id)).state is JobState.SUCCEEDED
    assert (await app.get(crashed.id)).state is JobState.FAILED
    seen = dict(recorder.executed)
    assert seen[ok.id].startswith("returned {")
    assert seen[crashed.id] == "raised RuntimeError"
