"""Finish: how each outcome is recorded, and how a pending cancel overrides it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tether.job import Beat, Job
from tether.states import JobState
from tether.store import Store

from .support import Db, assert_between, claim_one, outcome, running_job


async def finish_one(store: Store, job: Job, state: JobState, **fields: object) -> Job:
    """Record one outcome, check it was accepted, return the job after it."""
    accepted = await store.finish(job.worker_id or "w1", [outcome(job, state, **fields)])
    assert accepted == {job.id}
    after = await store.get(job.id)
    assert after is not None
    return after


async def test_succeeded_stores_result_clears_error_and_lease(store: Store, db: Db) -> None:
    first = await running_job(store, "w1", queue="q")
    await finish_one(store, first, JobState.RETRYING, error="boom")
    second = await claim_one(store, "w1", queue="q")
    assert second.error == "boom"
    before = db.now()
    done = await finish_one(
        store, second, JobState.SUCCEEDED, result_json='{"pages": [1, 2], "ok": true}'
    )
    after = db.now()
    assert done.state is JobState.SUCCEEDED
    assert done.result == {"pages": [1, 2], "ok": True}
    assert done.error is None
    assert_between(done.finished_at, before, after)
    assert done.lease_expires_at is None
    assert done.attempt == 2
    assert done.is_terminal
    assert await store.claim("w2", ["q"], ["t"], 1, 60) == []


async def test_retrying_waits_for_its_delay_in_database_time(store: Store, db: Db) -> None:
    job = await running_job(store, "w1", queue="q")
    before = db.now()
    retry = await finish_one(store, job, JobState.RETRYING, error="flaky", delay=30.0)
    after = db.now()
    delay = timedelta(seconds=30)
    assert retry.state is JobState.RETRYING
    assert_between(retry.run_at, before + delay, after + delay)
    assert retry.error == "flaky"
    assert retry.finished_at is None and retry.lease_expires_at is None
    assert retry.attempt == 1
    assert await store.claim("w1", ["q"], ["t"], 1, 60) == []
    db.make_due(job.id)
    again = await claim_one(store, "w2", queue="q")
    assert (again.id, again.attempt) == (job.id, 2)


async def test_retrying_without_delay_is_claimable_at_once(store: Store) -> None:
    job = await running_job(store, "w1", queue="q")
    await finish_one(store, job, JobState.RETRYING, error="flaky")
    assert (await claim_one(store, "w2", queue="q")).id == job.id


async def test_failed_keeps_the_error_and_is_final(store: Store, db: Db) -> None:
    job = await running_job(store, "w1", queue="q")
    before = db.now()
    failed = await finish_one(store, job, JobState.FAILED, error="Traceback: boom")
    after = db.now()
    assert failed.state is JobState.FAILED
    assert failed.error == "Traceback: boom"
    assert_between(failed.finished_at, before, after)
    assert failed.lease_expires_at is None and failed.result is None
    assert await store.claim("w1", ["q"], ["t"], 1, 60) == []


async def test_cancelled_outcome_is_final(store: Store) -> None:
    job = await running_job(store, "w1", queue="q")
    cancelled = await finish_one(store, job, JobState.CANCELLED, reason="stopped by handler")
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.finished_at is not None and cancelled.lease_expires_at is None
    assert (await store.events(job.id))[-1].reason == "stopped by handler"
    assert await store.claim("w1", ["q"], ["t"], 1, 60) == []


async def test_release_to_queued_does_not_spend_an_attempt_and_keeps_checkpoint(
    store: Store,
) -> None:
    job = await running_job(store, "w1", queue="q")
    assert job.attempt == 1
    assert await store.save_checkpoint(job.id, job.lease_token, '{"page": 41}')
    await store.heartbeat("w1", [Beat(job.id, job.lease_token, 41, 100)], 60)
    released = await finish_one(store, job, JobState.QUEUED, reason="shutdown")
    assert released.state is JobState.QUEUED
    assert released.attempt == 0
    assert released.checkpoint == {"page": 41}
    assert (released.progress_current, released.progress_total) == (41, 100)
    assert released.finished_at is None and released.lease_expires_at is None
    again = await claim_one(store, "w2", queue="q")
    assert (again.id, again.attempt, again.lease_token) == (job.id, 1, 2)
    assert again.checkpoint == {"page": 41}


@pytest.mark.parametrize(
    "requested", [JobState.FAILED, JobState.RETRYING, JobState.QUEUED], ids=lambda s: s.value
)
async def test_pending_cancel_turns_failure_retry_and_release_into_cancelled(
    store: Store, requested: JobState
) -> None:
    job = await running_job(store, "w1", queue="q")
    await store.request_cancel(job.id, "user asked", False, "alice")
    after = await finish_one(store, job, requested, error="x", reason="worker said so")
    assert after.state is JobState.CANCELLED
    assert after.finished_at is not None and after.lease_expires_at is None
    last = (await store.events(job.id))[-1]
    assert (last.from_state, last.to_state) == (JobState.RUNNING, JobState.CANCELLED)
    assert last.reason == "user asked"
    assert await store.claim("w1", ["q"], ["t"], 1, 60) == []


async def test_pending_cancel_leaves_succeeded_as_succeeded(store: Store) -> None:
    job = await running_job(store, "w1")
    await store.request_cancel(job.id, "too slow", True, "alice")
    done = await finish_one(store, job, JobState.SUCCEEDED, result_json="42")
    assert done.state is JobState.SUCCEEDED
    assert done.result == 42
    # The record still says a cancel was asked for, and why.
    assert done.cancel_requested_at is not None
    assert (done.cancel_reason, done.cancel_force) == ("too slow", True)
    assert (await store.events(job.id))[-1].to_state is JobState.SUCCEEDED


async def test_finish_records_several_outcomes_in_one_call(store: Store) -> None:
    a = await running_job(store, "w1")
    b = await running_job(store, "w1")
    c = await running_job(store, "w1")
    accepted = await store.finish(
        "w1",
        [
            outcome(a, JobState.SUCCEEDED, result_json='"a"'),
            outcome(b, JobState.FAILED, error="b"),
            outcome(c, JobState.RETRYING, error="c", delay=60),
        ],
    )
    assert accepted == {a.id, b.id, c.id}
    states = {j.id: j.state for j in [await store.get(x.id) for x in (a, b, c)] if j}
    assert states == {a.id: "succeeded", b.id: "failed", c.id: "retrying"}


async def test_finish_with_no_outcomes_accepts_nothing(store: Store) -> None:
    assert await store.finish("w1", []) == set()
