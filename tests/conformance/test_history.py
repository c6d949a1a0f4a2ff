"""A job's history: the same whole history on both stores, whatever PostgreSQL stores.

PostgreSQL does not store the transitions a job's own row gives (its creation by an
enqueue, the claim of its current run, its success) unless a live feed follows; the
history derives them (migration 0028). These tests check that the history reads the
same, transition for transition, whether they were stored or derived, and that what is
stored is what the rule says.
"""

from __future__ import annotations

from tether.job import Job
from tether.states import JobState
from tether.store import Store

from .support import Db, claim_one, enqueue_one, new_job, outcome, running_job, unnumbered

Q, R, S = JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED


def _stored(db: Db, job: Job) -> int:
    rows = db.execute("SELECT COUNT(*) FROM tether_job_events WHERE job_id = %s", (job.id,))
    return int(rows[0][0])


def _derives(db: Db) -> bool:
    return db.dialect == "postgresql"


async def _plain_run(store: Store) -> Job:
    job = await running_job(store, "w1")
    assert await store.finish("w1", [outcome(job, S)]) == {job.id}
    return job


async def test_a_plain_run_reads_whole_and_stores_only_what_a_row_cannot_give(
    store: Store, db: Db
) -> None:
    job = await _plain_run(store)
    events = await store.events(job.id)
    assert [(e.from_state, e.to_state, e.worker_id, e.actor) for e in events] == [
        (None, Q, None, "enqueue"),
        (Q, R, "w1", "worker"),
        (R, S, "w1", "w1"),
    ]
    done = await store.get(job.id)
    assert done is not None
    assert [e.at for e in events] == [done.created_at, done.started_at, done.finished_at]
    assert _stored(db, job) == (0 if _derives(db) else 3)
    assert all(e.id is None for e in events) is _derives(db)


async def test_a_followed_run_stores_every_transition_and_reads_the_same(
    store: Store, db: Db
) -> None:
    plain = await store.events((await _plain_run(store)).id)
    await store.announce_follower(60.0)
    job = await _plain_run(store)
    events = await store.events(job.id)
    assert _stored(db, job) == 3
    assert all(e.id is not None for e in events)
    assert [(e.from_state, e.to_state, e.worker_id, e.actor) for e in events] == [
        (e.from_state, e.to_state, e.worker_id, e.actor) for e in plain
    ]


async def test_a_feed_that_starts_or_stops_mid_run_leaves_the_history_whole(
    store: Store, db: Db
) -> None:
    # Claimed while nothing followed, succeeded while a feed did.
    early = await running_job(store, "w1")
    await store.announce_follower(60.0)
    await store.finish("w1", [outcome(early, S)])
    # Claimed while a feed followed, succeeded after it stopped.
    late = await running_job(store, "w1")
    if _derives(db):
        db.execute("DELETE FROM tether_listeners WHERE channel = 'tether_feed'")
    await store.finish("w1", [outcome(late, S)])
    for job in (early, late):
        events = await store.events(job.id)
        assert [(e.from_state, e.to_state) for e in events] == [(None, Q), (Q, R), (R, S)]
        claim = await store.get(job.id)
        assert claim is not None and events[1].at == claim.started_at
    if _derives(db):
        # early: its success; late: its creation and its claim.
        assert _stored(db, early) == 1 and _stored(db, late) == 2


async def test_leaving_a_run_otherwise_stores_its_claim_first(store: Store, db: Db) -> None:
    job = await running_job(store, "w1", max_attempts=3)
    first_start = job.started_at
    await store.finish("w1", [outcome(job, JobState.RETRYING, delay=0.0)])
    again = await claim_one(store, "w2", queue=job.queue)
    assert again.id == job.id
    events = await store.events(job.id)
    assert [(e.from_state, e.to_state, e.worker_id) for e in events] == [
        (None, Q, None),
        (Q, R, "w1"),
        (R, JobState.RETRYING, "w1"),
        (JobState.RETRYING, R, "w2"),
    ]
    assert events[1].at == first_start and events[1].id is not None
    assert events[3].at == again.started_at
    # Stored: the first claim and the retry; the current claim is the row's.
    assert _stored(db, job) == (2 if _derives(db) else 4)


async def test_a_deleted_job_keeps_its_whole_history(store: Store, db: Db) -> None:
    job = await _plain_run(store)
    before = await store.events(job.id)
    await store.delete(job.id, "alice")
    assert await store.get(job.id) is None
    after = await store.events(job.id)
    assert unnumbered(after) == unnumbered(before)
    assert all(e.id is not None for e in after)
    assert _stored(db, job) == 3


async def test_a_rescued_run_stores_its_claim_with_the_rescue(store: Store, db: Db) -> None:
    job = await running_job(store, "w-lost", max_attempts=2)
    db.expire_lease(job.id)
    await store.rescue()
    events = await store.events(job.id)
    assert [(e.from_state, e.to_state, e.actor) for e in events] == [
        (None, Q, "enqueue"),
        (Q, R, "worker"),
        (R, JobState.RETRYING, "rescuer"),
    ]
    assert events[1].worker_id == "w-lost" and events[1].at == job.started_at
    assert _stored(db, job) == (2 if _derives(db) else 3)


async def test_a_spawned_or_blocked_job_stores_its_creation(store: Store, db: Db) -> None:
    up = await enqueue_one(store)
    [down] = await store.enqueue([new_job(depends_on=(up.id,))])
    assert down.state is JobState.BLOCKED
    events = await store.events(down.id)
    assert [(e.from_state, e.to_state) for e in events] == [(None, JobState.BLOCKED)]
    assert _stored(db, down) == 1
