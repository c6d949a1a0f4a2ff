"""request_cancel: at once when the job waits, a flag when it runs, no-op when it is done."""

from __future__ import annotations

import pytest

from tether.errors import JobNotFoundError
from tether.job import Beat
from tether.states import JobState
from tether.store import Store

from .support import Db, assert_between, claim_one, enqueue_one, outcome, running_job


async def test_cancelling_a_queued_job_cancels_it_at_once(store: Store, db: Db) -> None:
    job = await enqueue_one(store, queue="q")
    before = db.now()
    cancelled = await store.request_cancel(job.id, "changed my mind", False, "alice")
    after = db.now()
    assert cancelled.state is JobState.CANCELLED
    assert_between(cancelled.finished_at, before, after)
    assert cancelled.cancel_reason == "changed my mind"
    assert cancelled.cancel_requested_at is not None
    assert await store.get(job.id) == cancelled
    assert await store.claim("w1", ["q"], ["t"], 1, 60) == []
    [_, event] = await store.events(job.id)
    assert (event.from_state, event.to_state) == (JobState.QUEUED, JobState.CANCELLED)
    assert (event.actor, event.reason) == ("alice", "changed my mind")


async def test_cancelling_a_delayed_job_cancels_it_at_once(store: Store) -> None:
    job = await enqueue_one(store, delay=3600.0)
    cancelled = await store.request_cancel(job.id, None, False, None)
    assert cancelled.state is JobState.CANCELLED and cancelled.finished_at is not None


async def test_cancelling_a_retrying_job_cancels_it_at_once(store: Store) -> None:
    job = await running_job(store, "w1", queue="q")
    await store.finish("w1", [outcome(job, JobState.RETRYING, delay=60)])
    cancelled = await store.request_cancel(job.id, "enough", False, "bob")
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.finished_at is not None
    assert cancelled.lease_expires_at is None
    db_events = await store.events(job.id)
    assert (db_events[-1].from_state, db_events[-1].to_state) == ("retrying", "cancelled")


async def test_cancelling_a_running_job_flags_it_and_keeps_it_running(store: Store, db: Db) -> None:
    job = await running_job(store, "w1")
    events = await store.events(job.id)
    before = db.now()
    flagged = await store.request_cancel(job.id, "stop please", True, "alice")
    after = db.now()
    assert flagged.state is JobState.RUNNING
    assert flagged.display_state == "cancelling"
    assert_between(flagged.cancel_requested_at, before, after)
    assert (flagged.cancel_reason, flagged.cancel_force) == ("stop please", True)
    assert flagged.finished_at is None
    # The lease is untouched: the worker keeps it until it stops the job.
    assert (flagged.worker_id, flagged.lease_token) == (job.worker_id, job.lease_token)
    assert flagged.lease_expires_at == job.lease_expires_at
    assert await store.events(job.id) == events
    beat = await store.heartbeat("w1", [Beat(job.id, job.lease_token)], 60)
    assert beat.alive == {job.id}


async def test_repeated_cancel_requests_keep_the_first_reason_and_time(store: Store) -> None:
    job = await running_job(store, "w1")
    first = await store.request_cancel(job.id, "first", False, "alice")
    second = await store.request_cancel(job.id, "second", False, "bob")
    assert second.cancel_reason == "first"
    assert second.cancel_requested_at == first.cancel_requested_at
    assert second.cancel_force is False
    assert second.state is JobState.RUNNING


async def test_a_later_forced_request_escalates_but_keeps_the_reason(store: Store) -> None:
    job = await running_job(store, "w1")
    await store.request_cancel(job.id, "first", False, "alice")
    forced = await store.request_cancel(job.id, "hurry", True, "bob")
    assert (forced.cancel_reason, forced.cancel_force) == ("first", True)
    # and force is never taken back
    again = await store.request_cancel(job.id, None, False, "carol")
    assert again.cancel_force is True


async def test_cancelling_a_blocked_job_cancels_it_at_once(store: Store) -> None:
    dep = await enqueue_one(store, queue="upstream")
    job = await enqueue_one(store, queue="q", depends_on=(dep.id,))
    assert job.state is JobState.BLOCKED
    cancelled = await store.request_cancel(job.id, "no", False, None)
    assert cancelled.state is JobState.CANCELLED and cancelled.finished_at is not None
    upstream = await store.get(dep.id)
    assert upstream is not None and upstream.state is JobState.QUEUED


async def test_cancelling_a_succeeded_or_cancelled_job_returns_it_unchanged(
    store: Store,
) -> None:
    for final in (JobState.SUCCEEDED, JobState.CANCELLED):
        job = await running_job(store, "w1")
        await store.finish("w1", [outcome(job, final)])
        before = await store.get(job.id)
        events = await store.events(job.id)
        returned = await store.request_cancel(job.id, "late", True, "alice")
        assert returned == before, final
        assert returned.state is final
        assert returned.cancel_requested_at is None and returned.cancel_reason is None
        assert await store.get(job.id) == before
        assert await store.events(job.id) == events


async def test_cancelling_a_failed_job_dismisses_it_and_keeps_its_error(store: Store) -> None:
    job = await running_job(store, "w1")
    await store.finish("w1", [outcome(job, JobState.FAILED, error="boom")])
    dismissed = await store.request_cancel(job.id, "won't fix", False, "alice")
    assert dismissed.state is JobState.CANCELLED
    assert dismissed.error == "boom"
    last = (await store.events(job.id))[-1]
    assert (last.from_state, last.to_state) == (JobState.FAILED, JobState.CANCELLED)
    assert (last.actor, last.reason) == ("alice", "won't fix")
    # and once cancelled it stays so
    assert await store.request_cancel(job.id, "again", True, "bob") == dismissed


async def test_cancelling_twice_keeps_the_first_cancellation(store: Store) -> None:
    job = await enqueue_one(store)
    first = await store.request_cancel(job.id, "first", False, "alice")
    second = await store.request_cancel(job.id, "second", True, "bob")
    assert second == first
    assert len(await store.events(job.id)) == 2


async def test_cancelling_an_unknown_job_raises_job_not_found(store: Store) -> None:
    with pytest.raises(JobNotFoundError) as info:
        await store.request_cancel(987654, "x", False, None)
    assert info.value.job_id == 987654
    assert await store.count_by_state() == {}


async def test_a_cancelled_job_is_never_claimed(store: Store) -> None:
    keep = await enqueue_one(store, queue="q")
    drop = await enqueue_one(store, queue="q", priority=10)
    await store.request_cancel(drop.id, None, False, None)
    assert (await claim_one(store, "w1", queue="q")).id == keep.id
    assert await store.claim("w1", ["q"], ["t"], 10, 60) == []
