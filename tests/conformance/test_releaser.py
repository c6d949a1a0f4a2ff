"""The releaser's sweep: no job waits on something that has already happened.

A workflow step missed by its transition (on PostgreSQL, a foreign transaction held a
row the step had to change past its lock timeout; on SQLite, a write that bypassed the
store's propagation) is made by the sweep, on every store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from tether.job import Job
from tether.maintenance import Releaser
from tether.states import JobState
from tether.store import Store, create_store

from .concurrency import stuck_jobs
from .support import Db, fresh_queue, new_job, outcome, running_job


@contextmanager
def _held(db: Db, job_id: int) -> Iterator[None]:
    """PostgreSQL: another client holds ``job_id``'s row (FOR UPDATE) meanwhile."""
    conn = psycopg.connect(db.url)
    conn.execute("SELECT 1 FROM tether_jobs WHERE id = %s FOR UPDATE", (job_id,))
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


async def _end_missing_its_release(
    store: Store, db: Db, job: Job, held: int, state: JobState = JobState.SUCCEEDED
) -> None:
    """End ``job`` so that the workflow step it should make is missed (on PostgreSQL,
    because another client holds the row ``held`` meanwhile)."""
    around = (
        "UPDATE tether_jobs SET state = %s, lease_expires_at = NULL, finished_at = "
        "started_at WHERE id = %s"
    )
    if db.dialect == "sqlite":
        # Around the store: its propagation never runs.
        db.execute(around, (state.value, job.id))
        return
    with _held(db, held):
        # The workflow step waits for the row only so long, then leaves it pending.
        assert await store.finish("w", [outcome(job, state)]) == {job.id}
    assert db.execute("SELECT job_id FROM tether_pending_steps") == [(job.id,)]


@pytest.fixture
async def releaser(store: Store) -> AsyncIterator[Releaser]:
    yield Releaser(store, interval=1.0, batch_size=2)


async def _state(store: Store, job_id: int) -> JobState:
    job = await store.get(job_id)
    assert job is not None
    return job.state


async def test_a_parent_whose_children_all_ended_is_released(
    store: Store, db: Db, releaser: Releaser
) -> None:
    parent = await running_job(store, "wp", task="parent")
    queue = fresh_queue()
    assert await store.spawn(parent.id, parent.lease_token, new_job("child", queue))
    assert await store.finish("wp", [outcome(parent, JobState.BLOCKED, phase="fanin")])
    [kid] = await store.claim("wc", [queue], ["child"], 1, 60.0)
    await _end_missing_its_release(store, db, kid, parent.id)
    assert stuck_jobs(db) == [parent.id]
    assert parent.id in await releaser.sweep()
    assert await _state(store, parent.id) is JobState.QUEUED
    assert stuck_jobs(db) == []


async def test_a_dependent_whose_dependencies_succeeded_is_queued_and_one_of_a_failed_cancelled(
    store: Store, db: Db, releaser: Releaser
) -> None:
    ok, bad = await running_job(store, "w"), await running_job(store, "w")
    [waits_ok, waits_bad] = await store.enqueue(
        [new_job(depends_on=(ok.id,)), new_job(depends_on=(bad.id,))]
    )
    await _end_missing_its_release(store, db, ok, waits_ok.id)
    assert stuck_jobs(db) == [waits_ok.id]
    assert waits_ok.id in await releaser.sweep()
    await _end_missing_its_release(store, db, bad, waits_bad.id, JobState.FAILED)
    assert stuck_jobs(db) == [waits_bad.id]
    assert waits_bad.id in await releaser.sweep()
    assert await _state(store, waits_ok.id) is JobState.QUEUED
    assert await _state(store, waits_bad.id) is JobState.CANCELLED
    assert stuck_jobs(db) == []


async def test_the_sweep_leaves_jobs_that_still_wait_and_walks_every_batch(
    store: Store, db: Db, releaser: Releaser
) -> None:
    # Five blocked jobs, two a batch: the stuck one is in the last batch.
    ups = [await running_job(store, "w") for _ in range(5)]
    deps = await store.enqueue([new_job(depends_on=(u.id,)) for u in ups])
    await _end_missing_its_release(store, db, ups[-1], deps[-1].id)
    found: list[int] = []
    for _ in range(3):
        found += await releaser.run_once()
    # The last dependent itself (SQLite), or its upstream's pending step (PostgreSQL).
    assert set(found) & {deps[-1].id, ups[-1].id}
    assert not {d.id for d in deps[:-1]} & set(found)
    assert [await _state(store, d.id) for d in deps] == [JobState.BLOCKED] * 4 + [JobState.QUEUED]
    assert await releaser.run_once() == []  # wrapped round to the first batch


async def test_only_the_leader_sweeps(store: Store) -> None:
    class NotLeading:
        leading = False

    follower: Any = NotLeading()
    assert not Releaser(store, interval=1.0, leader=follower).due()
    assert Releaser(store, interval=1.0).due()


@pytest.mark.postgres
async def test_the_active_children_of_a_parent_that_ended_are_cancelled(pg_url: str) -> None:
    # PostgreSQL only: SQLite's propagation runs under the write lock, never left over.
    store, db = create_store(pg_url), Db(pg_url)
    try:
        parent = await running_job(store, "wp", task="parent")
        kid = await store.spawn(parent.id, parent.lease_token, new_job("child", fresh_queue()))
        assert kid is not None
        # The parent succeeds while another client holds its queued child's row.
        await _end_missing_its_release(store, db, parent, kid.id)
        assert await _state(store, kid.id) is JobState.QUEUED
        assert await Releaser(store, interval=1.0).sweep() == [parent.id]
        assert await _state(store, kid.id) is JobState.CANCELLED
        assert db.execute("SELECT job_id FROM tether_pending_steps") == []
    finally:
        await store.close()
        db.close()


@pytest.mark.postgres
async def test_a_cancelled_parents_cascade_that_met_a_held_child_reaches_it_later(
    pg_url: str,
) -> None:
    # Found by the operation pairs: a child finishing while its parent is cancelled locks
    # the child, then the parent; the cancel, the parent, then the children. One of the
    # two steps waits past its bound and is left pending: if it is the cascade, the
    # parent ends cancelled while its running child has not yet been asked to stop.
    store, db = create_store(pg_url), Db(pg_url)
    try:
        parent = await running_job(store, "wp", task="parent")
        kid = await store.spawn(parent.id, parent.lease_token, new_job("child", fresh_queue()))
        assert kid is not None
        assert await store.finish("wp", [outcome(parent, JobState.BLOCKED, phase="fanin")])
        (running,) = await store.claim("wk", [kid.queue], ["child"], 1, 60.0)
        with _held(db, running.id):
            await store.request_cancel(parent.id, "r", False, "op")
        assert await _state(store, parent.id) is JobState.CANCELLED
        assert (await store.get(running.id)).cancel_requested_at is None
        assert db.execute("SELECT job_id FROM tether_pending_steps") == [(parent.id,)]
        assert await Releaser(store, interval=1.0).sweep() == [parent.id]
        child = await store.get(running.id)
        assert child.state is JobState.RUNNING and child.cancel_requested_at is not None
        assert db.execute("SELECT job_id FROM tether_pending_steps") == []
    finally:
        await store.close()
        db.close()
