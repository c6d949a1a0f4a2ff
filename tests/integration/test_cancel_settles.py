"""Every cancellation record settles, whoever dies, and waiting for one waits.

A record is driven by the process that called ``cancel()``; when that process dies or
the store fails half-way, a worker's follow-up (or anyone waiting on the record)
settles it from the job states.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import pytest

import tether
from tests.helpers import eventually, fast_config
from tether import App, JobState, RetryPolicy, StoreError, Worker
from tether.cancellation import CancellationResult, CancellationService
from tether.config import StoreRetry
from tether.job import Job
from tether.maintenance import CancellationFollowUp
from tether.store import Store

SETTLE_STEP = "settle_from_job_states"
CANCELLER = """
import asyncio, sys
from tether import App

async def main() -> None:
    app = App(sys.argv[1])
    await app.cancel(int(sys.argv[2]), wait=float(sys.argv[3]))

asyncio.run(main())
"""


def follow_up(store: Store) -> CancellationFollowUp:
    """A follow-up that adopts any record its canceller has stopped driving."""
    return CancellationFollowUp(CancellationService(store, 0.05, adopt_after=0), interval=1)


async def _record_in(app: App, job_id: int, status: str) -> tether.CancellationRecord | None:
    record = await app.cancellations.get(job_id)
    return record if record is not None and record.status == status else None


async def test_a_record_whose_canceller_was_killed_is_settled_and_a_later_cancel_works(
    app: App, db_url: str
) -> None:
    @app.task(name="work")
    async def work(ctx: tether.JobContext) -> None:
        return None

    job = await work.enqueue()
    store = await app.store()
    await store.register_worker("ghost", None, "elsewhere", 1, None, ["default"], 1)
    [running] = await store.claim("ghost", ["default"], ["work"], 1, 1.0)
    assert running.id == job.id
    canceller = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CANCELLER, db_url, str(job.id), "3"
    )
    try:
        await eventually(lambda: _record_in(app, job.id, "stopping_runners"), timeout=30)
    finally:
        os.kill(canceller.pid, signal.SIGKILL)
        await canceller.wait()
    # The job stops (its lease ends with the cancel pending); the record's driver is gone.
    await eventually(lambda: _rescued(store, job.id), timeout=30)
    assert (await app.get(job.id)).state is JobState.CANCELLED
    dead = await app.cancellations.get(job.id)
    assert dead is not None and dead.status == "stopping_runners"

    service = follow_up(store)
    # Adopted once the wait its canceller asked for (3 s) is over, not before.
    settled = await eventually(service.run_once, timeout=30, every=0.2)
    assert settled == [dead.id]
    record = await app.cancellations.get(job.id)
    assert record is not None and record.status == "completed"
    step = record.steps[-1]
    assert (step.name, step.details["previous_status"]) == (SETTLE_STEP, "stopping_runners")
    assert step.details["ended"] == {str(job.id): "cancelled"}
    assert record.result is not None and record.result.tasks_cancelled == [job.id]
    assert await service.run_once() == []

    later = await app.cancel(job.id, wait=1)
    assert (later.success, later.outcome, later.errors) == (True, "already_cancelled", [])
    assert await app.cancellations.wait(job.id, timeout=1) == (True, [])


async def _rescued(store: Store, job_id: int) -> bool:
    return any(j.id == job_id for j in await store.rescue())


async def test_a_record_left_half_way_is_settled_from_the_job_states(app: App) -> None:
    @app.task(name="work")
    async def work(ctx: tether.JobContext) -> None:
        return None

    job = await work.enqueue()
    store = await app.store()
    # What a canceller leaves when it dies right after creating its record (with a
    # request id, it asks only after that): the job was never asked to stop.
    row, created = await store.create_cancellation(
        "cancel-dead",
        job_id=job.id,
        request_id="r-1",
        reason="stop",
        force=False,
        cascade=True,
        initiated_by="someone",
    )
    assert created and row.status == "initiated"
    assert await follow_up(store).run_once() == ["cancel-dead"]
    assert (await app.get(job.id)).state is JobState.CANCELLED
    record = await app.cancellations.get(job.id)
    assert record is not None and record.status == "completed"
    assert [s.name for s in record.steps] == [SETTLE_STEP]
    assert await app.cancellations.wait(job.id, timeout=1) == (True, [])


class FailingStore:
    """The real store, except that ``method`` raises ``error`` on its first ``times``
    calls (a transient fault, or a bug)."""

    def __init__(self, store: Store, method: str, error: Exception, times: int = 1) -> None:
        self._store = store
        self._method = method
        self._error = error
        self.left = times

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._store, name)
        if name != self._method:
            return real

        async def flaky(*args: Any, **kwargs: Any) -> Any:
            if self.left > 0:
                self.left -= 1
                raise self._error
            return await real(*args, **kwargs)

        return flaky


async def waiting_job(app: App) -> Job:
    """A queued job of a task that does nothing."""

    @app.task(name="work")
    async def work(ctx: tether.JobContext) -> None:
        return None

    return await work.enqueue()


async def cancel_through(
    store: FailingStore, job: Job, *, wait: float = 1, retry: StoreRetry | None = None
) -> CancellationResult:
    """``job`` cancelled by a cancellation service over ``store`` (a faulty one)."""
    service = CancellationService(store, 0.05, retry=retry or StoreRetry())  # type: ignore[arg-type]
    return await service.cancel(
        job.id, reason="r", force=False, cascade=True, wait=wait, actor=None, request_id=None
    )


async def test_a_step_that_fails_once_is_retried_and_the_record_completes(app: App) -> None:
    job = await waiting_job(app)
    flaky = FailingStore(await app.store(), "update_cancellation", StoreError("blip"))
    result = await cancel_through(flaky, job)
    assert flaky.left == 0, "the fault was injected"
    assert (result.status, result.success, result.errors) == ("completed", True, [])
    assert result.tasks_cancelled == [job.id]


#: Quick retries, so a test that spends them all stays short.
QUICK = StoreRetry(attempts=4, backoff=RetryPolicy(base_delay=0.01, factor=2.0, jitter=0.0))


async def test_a_cancel_whose_first_request_fails_once_is_retried_and_completes(
    app: App,
) -> None:
    job = await waiting_job(app)
    flaky = FailingStore(await app.store(), "request_cancel", StoreError("blip"))
    result = await cancel_through(flaky, job, retry=QUICK)
    assert flaky.left == 0, "the fault was injected"
    assert (result.status, result.success, result.errors) == ("completed", True, [])
    assert (await app.get(job.id)).state is JobState.CANCELLED


async def test_a_cancel_whose_request_keeps_failing_is_recorded_failed_with_the_error(
    app: App,
) -> None:
    job = await waiting_job(app)
    down = FailingStore(await app.store(), "request_cancel", StoreError("down"), QUICK.attempts)
    with pytest.raises(StoreError, match="down"):
        await cancel_through(down, job, retry=QUICK)
    assert down.left == 0, "every try failed"
    record = await app.cancellations.get(job.id)
    assert record is not None and (record.status, record.error) == ("failed", "StoreError: down")
    assert [(s.name, s.status) for s in record.steps] == [("request", "failed")]
    assert (await app.get(job.id)).state is JobState.QUEUED  # it was never asked to stop
    # Once the store answers again, a new cancel works (the failed record is final).
    again = await app.cancel(job.id, wait=1)
    assert again.status == "completed" and again.cancellation_id != record.id


async def test_a_record_whose_writes_keep_failing_ends_failed_with_the_error(app: App) -> None:
    job = await waiting_job(app)
    down = FailingStore(
        await app.store(), "update_cancellation", StoreError("down"), QUICK.attempts
    )
    result = await cancel_through(down, job, retry=QUICK)
    assert down.left == 0, "every try of the first write failed"
    assert (result.status, result.success) == ("failed", False)
    assert result.errors == ["StoreError: down"]
    record = await app.cancellations.get(job.id)
    assert record is not None and (record.status, record.error) == ("failed", "StoreError: down")
    fault = record.steps[-1]
    assert (fault.name, fault.status, fault.details) == (
        "store_fault",
        "failed",
        {"during": "record request"},
    )


async def test_a_record_nobody_could_write_is_settled_by_the_follow_up(app: App) -> None:
    job = await waiting_job(app)
    store = await app.store()
    down = FailingStore(store, "update_cancellation", StoreError("down"), times=1000)
    result = await cancel_through(down, job, wait=0, retry=QUICK)
    assert result.status == "initiated" and "StoreError: down" in result.errors
    # The store answers again; the canceller has given up: the follow-up settles it.
    assert await follow_up(store).run_once() == [result.cancellation_id]
    record = await app.cancellations.get(job.id)
    assert record is not None and record.status == "completed"
    assert record.steps[-1].name == SETTLE_STEP


async def test_a_record_never_says_failed_while_its_job_is_cancelled_with_nothing_left(
    app: App,
) -> None:
    job = await waiting_job(app)
    # An unexpected error after the job was already cancelled, not worth a retry.
    broken = FailingStore(await app.store(), "downstream", RuntimeError("bug"))
    result = await cancel_through(broken, job)
    assert broken.left == 0, "the fault was injected"
    assert (await app.get(job.id)).state is JobState.CANCELLED
    assert (result.status, result.success, result.errors) == ("completed", True, [])
    step = result.steps[-1]
    assert step.name == SETTLE_STEP and "RuntimeError: bug" in step.details["why"]


async def test_waiting_for_a_cancellation_waits_until_the_job_has_stopped(app: App) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task(name="slow_to_stop")
    async def slow_to_stop(ctx: tether.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        await release.wait()
        ctx.check_cancelled()

    # No follow-up of the worker's in the way: the waiter must not need one.
    worker = Worker(app, fast_config(cancel_grace=30.0, rescue_interval=3600))
    await worker.start()
    try:
        job = await slow_to_stop.enqueue()
        await asyncio.wait_for(started.wait(), 10)
        answer = await app.cancel(job.id, wait=0)
        assert (answer.status, answer.outcome) == ("partial", "requested")
        waiter = asyncio.create_task(app.cancellations.wait(job.id, timeout=10))
        done, _ = await asyncio.wait({waiter}, timeout=0.5)
        assert not done, "it answered while the job still ran"
        assert (await app.get(job.id)).state is JobState.RUNNING
        release.set()
        assert await asyncio.wait_for(waiter, 15) == (True, [])
        assert (await app.get(job.id)).state is JobState.CANCELLED
        record = await app.cancellations.get(job.id)
        assert record is not None and record.status == "completed" and record.error is None
    finally:
        release.set()
        await worker.stop()
