"""Fencing: every worker write carries the lease token; a stale token changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest

from tests.helpers import eventually
from tether.job import Beat, Job, JobFilter, Outcome
from tether.states import JobState
from tether.store import Store, create_store

from .support import Db, claim_one, enqueue_one, new_job, outcome, running_job

OUTCOMES = [
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.RETRYING,
    JobState.QUEUED,
    JobState.CANCELLED,
    JobState.BLOCKED,
]


async def assert_all_writes_rejected(store: Store, job_id: int, token: int) -> None:
    """Heartbeat, checkpoint and every finish outcome with ``token`` change nothing."""
    before = await store.get(job_id)
    events = await store.events(job_id)
    beat = await store.heartbeat("stale", [Beat(job_id, token, 9, 9)], 3600)
    assert beat.alive == frozenset()
    assert beat.requests == ()
    assert await store.save_checkpoint(job_id, token, '{"stale": true}') is False
    for state in OUTCOMES:
        late = Outcome(job_id, token, state, result_json='"stale"', error="stale", reason="x")
        assert await store.finish("stale", [late]) == set()
    assert await store.get(job_id) == before
    assert await store.events(job_id) == events


@pytest.mark.parametrize("offset", [-1, 1], ids=["older", "newer"])
async def test_writes_with_a_wrong_token_on_a_running_job_change_nothing(
    store: Store, offset: int
) -> None:
    job = await running_job(store, "w1")
    await assert_all_writes_rejected(store, job.id, job.lease_token + offset)
    after = await store.get(job.id)
    assert after is not None and after.state is JobState.RUNNING


async def test_writes_with_the_current_token_are_accepted(store: Store) -> None:
    job = await running_job(store, "w1")
    beat = await store.heartbeat("w1", [Beat(job.id, job.lease_token, 1, 2)], 60)
    assert beat.alive == {job.id}
    assert await store.save_checkpoint(job.id, job.lease_token, '{"page": 3}') is True
    assert await store.finish("w1", [outcome(job, JobState.SUCCEEDED)]) == {job.id}
    done = await store.get(job.id)
    assert done is not None and done.checkpoint == {"page": 3} and done.progress_current == 1


async def test_writes_after_finish_are_rejected(store: Store) -> None:
    job = await running_job(store, "w1")
    assert await store.finish("w1", [outcome(job, JobState.SUCCEEDED)]) == {job.id}
    await assert_all_writes_rejected(store, job.id, job.lease_token)


async def test_old_token_writes_are_rejected_after_a_rescue(store: Store, db: Db) -> None:
    job = await running_job(store, "w-old", queue="q")
    db.expire_lease(job.id)
    [rescued] = await store.rescue()
    assert rescued.lease_token == job.lease_token + 1
    await assert_all_writes_rejected(store, job.id, job.lease_token)

    # The next attempt holds a newer token still; both older ones stay rejected.
    new = await claim_one(store, "w-new", queue="q")
    assert new.lease_token == job.lease_token + 2
    for stale in (job.lease_token, rescued.lease_token):
        await assert_all_writes_rejected(store, job.id, stale)
    assert await store.save_checkpoint(job.id, new.lease_token, '{"mine": 1}') is True
    assert await store.finish("w-new", [outcome(new, JobState.SUCCEEDED)]) == {job.id}
    done = await store.get(job.id)
    assert done is not None
    assert (done.state, done.worker_id, done.checkpoint) == ("succeeded", "w-new", {"mine": 1})


async def test_a_step_saved_with_an_old_token_is_refused_not_called_a_duplicate(
    store: Store, db: Db
) -> None:
    # A zombie's step, recorded by the new attempt meanwhile or not: a lost lease
    # (False), on SQLite too, where the write lock alone cannot answer for a row not
    # written.
    job = await running_job(store, "w-old", queue="q")
    db.expire_lease(job.id)
    await store.rescue()
    new = await claim_one(store, "w-new", queue="q")
    assert await store.save_step(job.id, job.lease_token, "s1", "1") is False
    assert await store.save_step(job.id, new.lease_token, "s1", "2") is True
    assert await store.save_step(job.id, job.lease_token, "s1", "1") is False
    assert [(s.name, s.result) for s in await store.steps(job.id)] == [("s1", 2)]


async def test_old_token_writes_are_rejected_after_a_release_and_reclaim(store: Store) -> None:
    job = await running_job(store, "w1", queue="q")
    assert await store.finish("w1", [outcome(job, JobState.QUEUED)]) == {job.id}
    again = await claim_one(store, "w2", queue="q")
    assert again.lease_token > job.lease_token
    await assert_all_writes_rejected(store, job.id, job.lease_token)


async def test_batched_writes_accept_only_the_fresh_tokens(store: Store) -> None:
    fresh = await running_job(store, "w1", queue="q")
    other = await running_job(store, "w1", queue="q2")
    beat = await store.heartbeat(
        "w1",
        [Beat(fresh.id, fresh.lease_token), Beat(other.id, other.lease_token + 5)],
        60,
    )
    assert beat.alive == {fresh.id}
    accepted = await store.finish(
        "w1",
        [
            outcome(fresh, JobState.SUCCEEDED),
            Outcome(other.id, other.lease_token + 5, JobState.SUCCEEDED),
        ],
    )
    assert accepted == {fresh.id}
    still: Job | None = await store.get(other.id)
    assert still == other


async def test_a_job_that_was_never_claimed_rejects_token_zero(store: Store) -> None:
    job = await enqueue_one(store)
    assert job.lease_token == 0
    await assert_all_writes_rejected(store, job.id, 0)


# -- INSERT-based writes held across a rescue --------------------------------------------

T = TypeVar("T")


async def hold_across_rescue(
    store: Store, db: Db, job: Job, write: Callable[[], Awaitable[T]], conflict: str
) -> T:
    """Run ``write`` (a worker write of ``job`` that INSERTs a row) while another
    transaction holds it up; let a rescue of ``job`` commit meanwhile; return what the
    write returned once it was let go.

    PostgreSQL: the other transaction has inserted a row with the same unique key
    (``conflict``, a statement with the parameter ``job.id``) and not committed, so the
    write waits on that key; the rescue commits while it waits, then the other
    transaction rolls back. SQLite serialises writers: the write runs once the rescue
    committed.
    """
    db.expire_lease(job.id)
    if db.dialect == "postgresql":
        with psycopg.connect(db.url) as other:
            other.execute(conflict, (job.id,))
            pending = asyncio.ensure_future(write())
            await eventually(lambda: _waiting_on_a_lock(db, pending))
            # The rescue comes from another process (the maintenance leader): the held
            # write keeps this store's connection busy.
            rescuer = create_store(db.url)
            try:
                assert [j.id for j in await rescuer.rescue()] == [job.id]
            finally:
                await rescuer.close()
            other.rollback()
        return await pending
    # SQLite serialises writers, and a waiting writer may take the lock in any order
    # once it is free: a write "held across" a rescue is one that runs after the rescue
    # committed, with the token it had before.
    assert [j.id for j in await store.rescue()] == [job.id]
    return await write()


async def _waiting_on_a_lock(db: Db, pending: asyncio.Future[Any]) -> bool:
    assert not pending.done(), "the write was not held up"
    rows = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%%INSERT INTO tether_%%'"
    )
    return bool(rows[0][0])


async def test_an_artifact_write_held_across_a_rescue_is_refused(store: Store, db: Db) -> None:
    job = await running_job(store, "w-old")
    accepted = await hold_across_rescue(
        store,
        db,
        job,
        lambda: store.save_artifact(job.id, job.lease_token, "out", b"late"),
        "INSERT INTO tether_artifacts (job_id, name, size, data) VALUES (%s, 'out', 0, '')",
    )
    assert accepted is False
    assert await store.get_artifact(job.id, "out") is None
    rescued = await store.get(job.id)
    assert rescued is not None and rescued.state is JobState.RETRYING


async def test_a_spawn_held_across_a_rescue_is_refused(store: Store, db: Db) -> None:
    parent = await running_job(store, "w-old")
    child = await hold_across_rescue(
        store,
        db,
        parent,
        lambda: store.spawn(parent.id, parent.lease_token, new_job(idempotency_key="kid")),
        "INSERT INTO tether_jobs (task, args, queue, state, max_attempts, idempotency_key) "
        "SELECT 't', '{}', 'elsewhere', 'queued', 1, 'kid' WHERE %s IS NOT NULL",
    )
    assert child is None
    assert await store.list_jobs(JobFilter(parent_id=parent.id)) == []
    rescued = await store.get(parent.id)
    assert rescued is not None and rescued.state is JobState.RETRYING
    assert db.execute("SELECT has_children FROM tether_jobs WHERE id = %s", (parent.id,)) == [
        (False,)
    ]


async def test_an_unhindered_artifact_write_and_spawn_are_accepted(store: Store, db: Db) -> None:
    parent = await running_job(store, "w1")
    assert await store.save_artifact(parent.id, parent.lease_token, "out", b"ok") is True
    assert await store.get_artifact(parent.id, "out") == b"ok"
    child = await store.spawn(parent.id, parent.lease_token, new_job(idempotency_key="kid"))
    assert child is not None and child.parent_id == parent.id
    assert db.execute("SELECT has_children FROM tether_jobs WHERE id = %s", (parent.id,)) == [
        (True,)
    ]
