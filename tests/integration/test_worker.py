"""A worker running real jobs against a real store (both stores)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import tether
from tests.helpers import eventually, fast_config
from tether import App, JobState, RetryPolicy, StoreError, Worker

NO_WAIT = RetryPolicy(base_delay=0.0, jitter=0.0)


@pytest.fixture
async def run_worker(app: App) -> AsyncIterator[Callable[..., Any]]:
    """Start workers for ``app``; all are stopped at the end of the test."""
    started: list[Worker] = []

    async def start(**overrides: Any) -> Worker:
        worker = Worker(app, fast_config(**overrides))
        await worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.stop()


async def test_async_job_succeeds_with_result_and_events(app: App, run_worker: Any) -> None:
    @app.task
    async def add(ctx: tether.JobContext, a: int, b: int) -> int:
        return a + b

    await run_worker()
    job = await add.enqueue(a=2, b=3)
    done = await app.wait(job.id, timeout=10)
    assert done.state is JobState.SUCCEEDED
    assert done.result == 5
    assert done.attempt == 1
    assert done.lease_expires_at is None
    assert done.finished_at is not None
    path = [(e.from_state, e.to_state) for e in await app.jobs.events(job.id)]
    assert path == [
        (None, JobState.QUEUED),
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.RUNNING, JobState.SUCCEEDED),
    ]


async def test_sync_handler_runs_in_a_thread(app: App, run_worker: Any) -> None:
    @app.task
    def where(ctx: tether.SyncJobContext) -> str:
        ctx.save_checkpoint({"saved": True})
        return threading.current_thread().name

    await run_worker()
    done = await app.wait((await where.enqueue()).id, timeout=10)
    assert done.state is JobState.SUCCEEDED
    assert done.result.startswith("tether-job")
    assert done.checkpoint == {"saved": True}


async def test_failing_job_retries_then_fails_with_max_retries_exceeded(
    app: App, run_worker: Any
) -> None:
    @app.task(max_attempts=3, retry=NO_WAIT)
    async def broken(ctx: tether.JobContext) -> None:
        raise ValueError(f"boom on attempt {ctx.attempt}")

    await run_worker()
    done = await app.wait((await broken.enqueue()).id, timeout=10)
    assert done.state is JobState.FAILED
    assert done.attempt == 3
    assert "boom on attempt 3" in (done.error or "")
    reasons = [e.reason for e in await app.jobs.events(done.id) if e.from_state is JobState.RUNNING]
    assert reasons[0] is not None and reasons[0].startswith("retry 1/2")
    assert reasons[1] is not None and reasons[1].startswith("retry 2/2")
    assert reasons[2] is not None and reasons[2].startswith("max retries exceeded (2)")


async def test_flaky_job_succeeds_on_a_later_attempt(app: App, run_worker: Any) -> None:
    @app.task(max_attempts=3, retry=NO_WAIT)
    async def flaky(ctx: tether.JobContext) -> int:
        if ctx.attempt < 2:
            raise tether.Retry("not yet", delay=0)
        return ctx.attempt

    await run_worker()
    done = await app.wait((await flaky.enqueue()).id, timeout=10)
    assert (done.state, done.result, done.error) == (JobState.SUCCEEDED, 2, None)


async def test_fail_stops_retries_at_once(app: App, run_worker: Any) -> None:
    @app.task(max_attempts=5, retry=NO_WAIT)
    async def hopeless(ctx: tether.JobContext) -> None:
        raise tether.Fail("bad input")

    await run_worker()
    done = await app.wait((await hopeless.enqueue()).id, timeout=10)
    assert (done.state, done.attempt) == (JobState.FAILED, 1)
    assert "bad input" in (done.error or "")


async def test_retry_backoff_delays_the_next_attempt(app: App, run_worker: Any) -> None:
    @app.task(max_attempts=2, retry=RetryPolicy(base_delay=30, jitter=0))
    async def later(ctx: tether.JobContext) -> None:
        raise RuntimeError("try again later")

    await run_worker()
    job = await later.enqueue()
    retrying = await eventually(lambda: _in_state(app, job.id, JobState.RETRYING), timeout=10)
    assert retrying.started_at is not None
    wait = (retrying.run_at - retrying.started_at).total_seconds()
    assert 29 < wait < 32


async def test_timeout_counts_as_a_failed_attempt(app: App, run_worker: Any) -> None:
    @app.task(max_attempts=1, timeout=0.2)
    async def sleepy(ctx: tether.JobContext) -> None:
        await asyncio.sleep(30)

    await run_worker()
    done = await app.wait((await sleepy.enqueue()).id, timeout=10)
    assert done.state is JobState.FAILED
    assert "timed out after 0.2s" in (done.error or "")


async def test_non_json_result_fails_the_job(app: App, run_worker: Any) -> None:
    @app.task(max_attempts=3)
    async def weird(ctx: tether.JobContext) -> object:
        return object()

    await run_worker()
    done = await app.wait((await weird.enqueue()).id, timeout=10)
    assert (done.state, done.attempt) == (JobState.FAILED, 1)
    assert "not JSON" in (done.error or "")


async def test_nul_characters_in_errors_and_results_do_not_block_other_outcomes(
    app: App, run_worker: Any
) -> None:
    @app.task(max_attempts=1)
    async def raises(ctx: tether.JobContext) -> None:
        raise ValueError("bad \x00 byte")

    @app.task(max_attempts=1)
    async def returns(ctx: tether.JobContext) -> str:
        return "ok\x00?"

    @app.task
    async def fine(ctx: tether.JobContext, note: str = "") -> int:
        return 1

    await run_worker()
    jobs = [await raises.enqueue(), await returns.enqueue(), await fine.enqueue()]
    done = [await app.wait(j.id, timeout=10) for j in jobs]
    assert [d.state for d in done] == [JobState.FAILED, JobState.FAILED, JobState.SUCCEEDED]
    assert "bad \\x00 byte" in (done[0].error or "")
    assert "NUL" in (done[1].error or "") and done[2].result == 1
    with pytest.raises(tether.InvalidJobError, match="NUL"):
        await fine.enqueue(note="\x00")


async def test_cancel_queued_job_is_immediate_and_it_never_runs(app: App) -> None:
    ran = []

    @app.task
    async def never(ctx: tether.JobContext) -> None:
        ran.append(ctx.id)

    job = await never.enqueue()
    result = await app.cancel(job.id, reason="not needed")
    assert result.outcome == "cancelled"
    assert result.job.state is JobState.CANCELLED
    assert result.job.cancel_reason == "not needed"
    worker = Worker(app, fast_config())
    await worker.start(services=False)
    assert await worker.claimer.run_once() == 0
    await worker.stop()
    assert ran == []


async def test_cancel_running_async_job_delivers_signal_then_cancelled_error(
    app: App, run_worker: Any
) -> None:
    seen: list[str] = []
    started = asyncio.Event()

    @app.task
    async def stubborn(ctx: tether.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        seen.append(f"signal:{ctx.cancelled.reason}")
        try:
            await asyncio.sleep(30)  # ignores the signal; the grace period ends this
        except asyncio.CancelledError:
            seen.append("CancelledError")
            raise

    await run_worker()
    job = await stubborn.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    result = await app.cancel(job.id, reason="stop it")
    assert result.outcome == "cancelled"
    assert result.job.state is JobState.CANCELLED
    assert seen == ["signal:cancel", "CancelledError"]
    last = (await app.jobs.events(job.id))[-1]
    assert (last.from_state, last.to_state, last.reason) == (
        JobState.RUNNING,
        JobState.CANCELLED,
        "stop it",
    )


async def test_cancel_running_sync_job_is_cooperative(app: App, run_worker: Any) -> None:
    started = threading.Event()

    @app.task
    def loop(ctx: tether.SyncJobContext) -> None:
        started.set()
        while True:
            ctx.check_cancelled()
            ctx.cancelled.wait_sync(0.01)

    await run_worker()
    job = await loop.enqueue()
    assert await asyncio.to_thread(started.wait, 10)
    result = await app.cancel(job.id)
    assert (result.outcome, result.job.state) == ("cancelled", JobState.CANCELLED)


async def test_force_cancel_skips_the_grace_period(app: App, run_worker: Any) -> None:
    started = asyncio.Event()

    @app.task
    async def deaf(ctx: tether.JobContext) -> None:
        started.set()
        await asyncio.sleep(30)

    await run_worker(cancel_grace=20.0)
    job = await deaf.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    result = await app.cancel(job.id, force=True, wait=5)
    assert result.outcome == "cancelled"


async def test_job_that_finishes_before_seeing_cancel_stays_succeeded(
    app: App, run_worker: Any
) -> None:
    release = asyncio.Event()

    @app.task
    async def quick(ctx: tether.JobContext) -> str:
        await release.wait()
        return "done"  # returns without looking at ctx.cancelled

    await run_worker(cancel_grace=5.0)
    job = await quick.enqueue()
    await eventually(lambda: _in_state(app, job.id, JobState.RUNNING))
    cancelling = asyncio.create_task(app.cancel(job.id, wait=10))
    await eventually(lambda: _cancel_flagged(app, job.id))
    release.set()
    result = await cancelling
    assert result.outcome == "finished_first"
    assert (result.job.state, result.job.result) == (JobState.SUCCEEDED, "done")
    assert result.job.cancel_requested_at is not None, "the request was recorded, and lost the race"


async def test_cancelling_a_succeeded_job_is_refused_and_changes_nothing(
    app: App, run_worker: Any
) -> None:
    @app.task
    async def fine(ctx: tether.JobContext) -> int:
        return 1

    await run_worker()
    done = await app.wait((await fine.enqueue()).id, timeout=10)
    with pytest.raises(tether.IllegalTransitionError, match="it is succeeded"):
        await app.cancel(done.id)
    after = await app.get(done.id)
    assert after == done


async def test_graceful_stop_releases_long_job_with_checkpoint_and_next_worker_resumes(
    app: App,
) -> None:
    steps: list[tuple[int, int]] = []
    halfway = asyncio.Event()
    runs: list[int] = []

    @app.task(max_attempts=1)
    async def long(ctx: tether.JobContext, n: int) -> int:
        start = (ctx.checkpoint or {}).get("next", 0)
        runs.append(start)
        for i in range(start, n):
            steps.append((ctx.attempt, i))
            await ctx.save_checkpoint({"next": i + 1})
            if i == 2:
                halfway.set()
            # The first run hangs after step 2, so the stop must release it there.
            await asyncio.sleep(30 if len(runs) == 1 and i == 2 else 0.01)
        return n

    first = Worker(app, fast_config(stop_timeout=0.2))
    await first.start()
    job = await long.enqueue(n=5)
    await asyncio.wait_for(halfway.wait(), 10)
    await first.stop()
    released = await app.get(job.id)
    assert released.state is JobState.QUEUED
    assert released.checkpoint == {"next": 3}
    assert released.attempt == 0, "a release must not spend an attempt"

    second = Worker(app, fast_config())
    await second.start()
    try:
        done = await app.wait(job.id, timeout=10)
    finally:
        await second.stop()
    assert (done.state, done.result, done.attempt) == (JobState.SUCCEEDED, 5, 1)
    assert [i for _, i in steps] == [0, 1, 2, 3, 4]
    assert runs == [0, 3], "the second run starts from the checkpoint"


async def test_a_claim_out_when_the_stop_begins_hands_its_jobs_back_unstarted(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[int] = []

    @app.task
    async def work(ctx: tether.JobContext) -> None:
        ran.append(ctx.id)

    worker = Worker(app, fast_config())
    await worker.start(services=False)
    job = await work.enqueue()
    out, gate = asyncio.Event(), asyncio.Event()
    real = worker.store.claim

    async def slow_claim(*args: Any) -> list[tether.Job]:
        out.set()
        await gate.wait()  # the claim is out when the signal lands
        return await real(*args)

    monkeypatch.setattr(worker.store, "claim", slow_claim)
    claiming = asyncio.create_task(worker.claimer.run_once())
    await out.wait()
    worker.request_stop()
    gate.set()
    assert await claiming == 1
    await asyncio.wait_for(worker.stop(), 10)
    assert ran == []
    after = await app.get(job.id)
    assert (after.state, after.attempt) == (JobState.QUEUED, 0)
    last = (await app.jobs.events(job.id))[-1]
    assert last.from_state is JobState.RUNNING and "not started" in (last.reason or "")


async def test_short_jobs_finish_during_graceful_stop(app: App) -> None:
    started, gate = asyncio.Event(), asyncio.Event()

    @app.task
    async def short(ctx: tether.JobContext) -> str:
        started.set()
        await gate.wait()
        return "ok"

    worker = Worker(app, fast_config(stop_timeout=10))
    await worker.start()
    job = await short.enqueue()
    # Started, not only claimed: a claim still on its way when the stop begins hands
    # its jobs back unstarted.
    await asyncio.wait_for(started.wait(), 10)
    stopping = asyncio.create_task(worker.stop())
    await asyncio.sleep(0)  # let the stop begin before the job may finish
    later = await short.enqueue()
    gate.set()
    await stopping
    assert (await app.get(job.id)).state is JobState.SUCCEEDED
    assert (await app.get(later.id)).state is JobState.QUEUED, "nothing is claimed once stopping"


async def test_lost_lease_stops_the_job_and_records_nothing(app: App) -> None:
    started = asyncio.Event()
    stopped: list[str | None] = []

    @app.task(max_attempts=3)
    async def victim(ctx: tether.JobContext) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            stopped.append(ctx.cancelled.reason)
        return "late"

    worker = Worker(app, fast_config())
    await worker.start(services=False)
    job = await victim.enqueue()
    assert await worker.claimer.run_once() == 1
    await asyncio.wait_for(started.wait(), 10)
    # Another worker's rescuer takes the job over: the token moves on.
    store = await app.store()
    await store.set_worker_state(worker.id, "dead")
    rescued = await store.rescue()
    assert [j.id for j in rescued] == [job.id]
    await worker.heartbeater.run_once()
    await eventually(lambda: _idle(worker))
    assert stopped == ["lease_lost"]
    after = await app.get(job.id)
    assert after.state is JobState.RETRYING
    assert after.result is None
    assert after.lease_token == rescued[0].lease_token
    await worker.stop()


async def test_two_claims_at_once_and_one_fails_the_other_jobs_still_run(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = asyncio.Event()

    @app.task
    async def held(ctx: tether.JobContext) -> None:
        await release.wait()

    worker = Worker(app, fast_config(concurrency=4, claim_batch=2))
    await worker.start(services=False)
    await app.enqueue_many([(held, {})] * 4)
    store = worker.store
    real, calls = store.claim, 0

    async def second_fails(*args: Any) -> list[tether.Job]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise tether.StoreError("connection lost")
        return await real(*args)

    monkeypatch.setattr(store, "claim", second_fails)
    with pytest.raises(tether.StoreError):
        await worker.claimer.run_once()
    # The claim that went through leased two jobs: they run here, not wait for rescue.
    assert calls == 2 and len(worker.running) == 2
    assert (await app.jobs.stats())["running"] == 2
    release.set()
    await worker.wait_idle()
    await worker.stop()
    assert (await app.jobs.stats())["succeeded"] == 2


async def test_heartbeat_extends_leases_and_flushes_progress(app: App) -> None:
    go = asyncio.Event()

    @app.task
    async def progressing(ctx: tether.JobContext) -> None:
        ctx.set_progress(3, 10)
        await go.wait()

    worker = Worker(app, fast_config())
    await worker.start(services=False)
    job = await progressing.enqueue()
    await worker.claimer.run_once()
    first = await app.get(job.id)
    await eventually(lambda: _progress_set(worker))
    await asyncio.sleep(0.01)  # the database clock must move on
    await worker.heartbeater.run_once()
    beat = await app.get(job.id)
    assert (beat.progress_current, beat.progress_total) == (3, 10)
    assert beat.lease_expires_at is not None and first.lease_expires_at is not None
    assert beat.lease_expires_at > first.lease_expires_at
    go.set()
    await app.wait(job.id, timeout=10)
    await worker.stop()


async def test_worker_only_claims_tasks_it_knows(app: App, run_worker: Any) -> None:
    @app.task
    async def known(ctx: tether.JobContext) -> None:
        return None

    store = await app.store()
    from tether.job import NewJob

    (foreign,) = await store.enqueue(
        [NewJob(task="elsewhere.task", args_json="{}", queue="default")]
    )
    await run_worker()
    done = await app.wait((await known.enqueue()).id, timeout=10)
    assert done.state is JobState.SUCCEEDED
    assert (await app.get(foreign.id)).state is JobState.QUEUED


async def test_queues_isolate_work(app: App, run_worker: Any) -> None:
    @app.task(queue="emails")
    async def send(ctx: tether.JobContext) -> None:
        return None

    worker = Worker(app, fast_config(queues=("default",)))
    await worker.start(services=False)
    await send.enqueue()
    assert await worker.claimer.run_once() == 0
    await worker.stop()


async def _in_state(app: App, job_id: int, state: JobState) -> tether.Job | None:
    job = await app.get(job_id)
    return job if job.state is state else None


async def _cancel_flagged(app: App, job_id: int) -> bool:
    return (await app.get(job_id)).cancel_requested_at is not None


async def _idle(worker: Worker) -> bool:
    return not worker.running


async def _progress_set(worker: Worker) -> bool:
    return any(r.ctx.progress == (3, 10) for r in worker.running.values())


async def test_default_concurrency_is_higher_when_every_task_is_async(app: App) -> None:
    @app.task
    async def fetch(ctx: tether.JobContext) -> None:
        pass

    async_only = Worker(app, fast_config(concurrency=None))
    assert async_only.concurrency == tether.config.ASYNC_CONCURRENCY
    assert async_only.threads.size == async_only.concurrency + 4

    @app.task
    def crunch(ctx: tether.SyncJobContext) -> None:
        pass

    # A thread slot costs an OS thread: an app with thread tasks keeps the lower default.
    mixed = Worker(app, fast_config(concurrency=None))
    assert mixed.concurrency == tether.config.THREAD_CONCURRENCY
    assert mixed.threads.size == mixed.concurrency + 4
    assert Worker(app, fast_config(concurrency=7)).concurrency == 7


async def test_a_worker_whose_heartbeat_fails_claims_nothing_until_one_gets_through(
    app: App,
) -> None:
    # Its row looks stale then, and if its session is gone too it may be presumed dead
    # at any moment: what it claimed would be rescued while it ran.
    @app.task
    async def noop(ctx: tether.JobContext) -> None:
        return None

    worker = Worker(app, fast_config())
    await worker.start(services=False)
    try:
        await noop.enqueue()
        worker.heartbeater.healthy = False  # as a failed heartbeat leaves it
        with pytest.raises(StoreError, match="heartbeat is failing"):
            await worker.claimer.run_once()
        await worker.heartbeater.run_once()
        assert await worker.claimer.run_once() == 1
    finally:
        await worker.stop()
