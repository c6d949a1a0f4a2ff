"""Rows held by another client: a worker's writes and the rescue skip them, never wait.

Any client may hold any row for as long as it likes: a caller's transaction that
enqueues a dependent of a running job (its foreign-key check takes ``FOR KEY SHARE``,
its ``has_dependents`` update a row lock), an operator's ``SELECT ... FOR UPDATE`` in
psql. On PostgreSQL, each kind of row lock is held on one of a worker's job rows from a
second connection while the heartbeat, the finish and the rescue run: each returns
promptly, does its work on the other rows, and does not count the held one as lost.
SQLite has no row locks (a held write transaction stops every writer, and the worker's
calls then fail whole and are retried; the self-fence covers a long one), so the row
tests are PostgreSQL's; the rescue's liveness rule (beats that arrive, not clocks) is
tested on both stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

import psycopg
import pytest

from tether.job import Beat
from tether.maintenance.rescuer import BeatWatch
from tether.states import JobState
from tether.store import Store

from .support import Db, outcome, running_job

# Each kind of row lock a client can take. FOR KEY SHARE (a foreign-key check) does not
# even conflict with the worker's writes, which take FOR NO KEY UPDATE.
LOCK_MODES = ["FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE"]
CONFLICTS = {"FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE"}
# Generous: a call that waits for the lock would hang until the holder lets go.
PROMPT = 5.0


@contextlib.contextmanager
def held(url: str, table: str, row_id: object, mode: str) -> Iterator[None]:
    """Hold one row of ``table`` locked in ``mode`` from a connection of its own."""
    with psycopg.connect(url) as conn:
        conn.execute(f"SELECT 1 FROM {table} WHERE id = %s {mode}", (row_id,))
        try:
            yield
        finally:
            conn.rollback()


# The row tests run on PostgreSQL alone (SQLite has no row locks: a held write
# transaction stops every writer), by choosing the store rather than skipping one.
PG_ONLY = pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


async def _register(store: Store, worker: str) -> None:
    await store.register_worker(worker, None, "h", os.getpid(), None, ["q"], 1)


def _beats(*jobs: object) -> list[Beat]:
    return [Beat(j.id, j.lease_token) for j in jobs]  # type: ignore[attr-defined]


def _lease(db: Db, job_id: int) -> object:
    return db.execute("SELECT lease_expires_at FROM tether_jobs WHERE id = %s", (job_id,))[0][0]


@PG_ONLY
@pytest.mark.parametrize("mode", LOCK_MODES)
async def test_a_heartbeat_skips_a_held_row_extends_the_others_and_keeps_the_held_job(
    store: Store, db: Db, db_url: str, mode: str
) -> None:
    await _register(store, "w1")
    a = await running_job(store, "w1", lease=5)
    b = await running_job(store, "w1", lease=5)
    before = {a.id: _lease(db, a.id), b.id: _lease(db, b.id)}
    with held(db_url, "tether_jobs", a.id, mode):
        res = await asyncio.wait_for(store.heartbeat("w1", _beats(a, b), 60), PROMPT)
    assert res.alive == {a.id, b.id}  # neither is lost
    assert res.counted  # the beat reached the worker's row
    assert _lease(db, b.id) != before[b.id]
    if mode in CONFLICTS:
        assert res.held == {a.id}
        assert _lease(db, a.id) == before[a.id]  # skipped, not waited for
    else:
        assert res.held == frozenset()
        assert _lease(db, a.id) != before[a.id]
    # Once released, the next beat extends it.
    res = await store.heartbeat("w1", _beats(a, b), 60)
    assert (res.alive, res.held) == ({a.id, b.id}, frozenset())


@PG_ONLY
async def test_a_heartbeat_still_reports_a_lost_lease_while_its_row_is_held(
    store: Store, db: Db, db_url: str
) -> None:
    await _register(store, "w1")
    a = await running_job(store, "w1")
    db.expire_lease(a.id)
    [rescued] = await store.rescue()
    assert rescued.id == a.id
    with held(db_url, "tether_jobs", a.id, "FOR UPDATE"):
        res = await asyncio.wait_for(store.heartbeat("w1", _beats(a), 60), PROMPT)
    assert res.alive == frozenset() and res.held == frozenset()


@PG_ONLY
@pytest.mark.parametrize("mode", ["FOR UPDATE", "FOR SHARE"])
async def test_a_beat_that_cannot_reach_the_worker_row_is_not_counted(
    store: Store, db: Db, db_url: str, mode: str
) -> None:
    await _register(store, "w1")
    a = await running_job(store, "w1")
    [(count, _)] = (await store.worker_beats()).values()
    with held(db_url, "tether_workers", "w1", mode):
        res = await asyncio.wait_for(store.heartbeat("w1", _beats(a), 60), PROMPT)
    assert res.alive == {a.id}
    assert not res.counted
    assert (await store.worker_beats())["w1"][0] == count
    assert (await store.heartbeat("w1", _beats(a), 60)).counted
    assert (await store.worker_beats())["w1"][0] == count + 1


@PG_ONLY
@pytest.mark.parametrize("mode", LOCK_MODES)
async def test_a_finish_records_the_batch_and_leaves_a_held_row_pending(
    store: Store, db: Db, db_url: str, mode: str
) -> None:
    a = await running_job(store, "w1")
    b = await running_job(store, "w1")
    outcomes = [outcome(a, JobState.SUCCEEDED), outcome(b, JobState.SUCCEEDED)]
    with held(db_url, "tether_jobs", a.id, mode):
        done = await asyncio.wait_for(store.finish("w1", outcomes), PROMPT)
    assert b.id in done
    if mode in CONFLICTS:
        assert a.id not in done and done.held == {a.id}
        assert db.state(a.id) == "running"
        done = await store.finish("w1", outcomes[:1])  # the completer's next round
    assert a.id in done and done.held == frozenset()
    assert (db.state(a.id), db.state(b.id)) == ("succeeded", "succeeded")


@PG_ONLY
@pytest.mark.parametrize("mode", LOCK_MODES)
async def test_one_held_row_does_not_delay_the_rescue_of_the_others(
    store: Store, db: Db, db_url: str, mode: str
) -> None:
    await _register(store, "w-dead")
    a = await running_job(store, "w-dead")
    b = await running_job(store, "w-dead")
    await store.set_worker_state("w-dead", "dead")
    with held(db_url, "tether_jobs", a.id, mode):
        rescued = await asyncio.wait_for(store.rescue({}), PROMPT)
    expected = {b.id} if mode in CONFLICTS else {a.id, b.id}
    assert {j.id for j in rescued} == expected
    if mode in CONFLICTS:
        assert [j.id for j in await store.rescue({})] == [a.id]  # the next round


@PG_ONLY
@pytest.mark.parametrize("mode", LOCK_MODES)
async def test_marking_dead_workers_skips_a_held_worker_row(
    store: Store, db: Db, db_url: str, mode: str
) -> None:
    await _register(store, "w1")
    await _register(store, "w2")
    with held(db_url, "tether_workers", "w1", mode):
        dead = await asyncio.wait_for(store.mark_dead_workers(lambda p: True, 10.0), PROMPT)
    assert set(dead) <= {"w1", "w2"} and "w2" in dead


# -- liveness by beats that arrive, not by clocks (both stores) ---------------------------


async def test_an_expired_lease_of_a_worker_whose_beats_arrive_is_not_rescued(
    store: Store, db: Db
) -> None:
    # The lease looks expired (a step of the clock that judges leases, or a row held so
    # that the lease could not be extended), but the worker's beats arrive: no rescuer
    # that watched them counts it quiet, and its job stays.
    await _register(store, "w1")
    job = await running_job(store, "w1")
    await store.heartbeat("w1", _beats(job), 60)
    db.expire_lease(job.id)
    assert await store.rescue({}) == []
    watch = BeatWatch()
    watch.observe(await store.worker_beats(), 0.0)
    assert watch.quiet(30.0) == {}  # watched for less than its lease
    assert await store.rescue(watch.quiet(30.0)) == []
    assert db.state(job.id) == "running"


async def test_a_quiet_worker_loses_its_expired_jobs_unless_it_beat_since(
    store: Store, db: Db
) -> None:
    await _register(store, "w1")
    job = await running_job(store, "w1")
    await store.heartbeat("w1", _beats(job), 60)
    watch = BeatWatch()
    watch.observe(await store.worker_beats(), 0.0)
    quiet = watch.quiet(60.0)
    assert list(quiet) == ["w1"]
    db.expire_lease(job.id)
    # A beat lands after the rescuer looked: the count it saw is stale, nothing moves.
    await store.heartbeat("w1", _beats(job), 60)
    db.expire_lease(job.id)
    assert await store.rescue(quiet) == []
    # Quiet at the count the store holds: rescued.
    watch.observe(await store.worker_beats(), 1.0)
    [rescued] = await store.rescue(watch.quiet(61.0))
    assert rescued.id == job.id and rescued.state is JobState.RETRYING


async def test_a_valid_lease_of_a_quiet_worker_is_not_rescued(store: Store) -> None:
    await _register(store, "w1")
    job = await running_job(store, "w1", lease=3600)
    [(count, _)] = (await store.worker_beats()).values()
    assert await store.rescue({"w1": count}) == []
    assert (await store.get(job.id)).state is JobState.RUNNING  # type: ignore[union-attr]


async def test_a_stopped_worker_loses_its_running_jobs_at_once(store: Store) -> None:
    await _register(store, "w1")
    job = await running_job(store, "w1", lease=3600)
    await store.set_worker_state("w1", "stopped")
    [rescued] = await store.rescue({})
    assert rescued.id == job.id


async def test_a_job_its_live_worker_dropped_goes_back_when_its_lease_expires(
    store: Store, db: Db
) -> None:
    # The worker fenced itself during a partition and stopped the job, recording
    # nothing; its beats arrive again but no longer list the job: its lease decides.
    await _register(store, "w1")
    kept = await running_job(store, "w1")
    dropped = await running_job(store, "w1")
    # Claimed before the beat before the last one (a claim may overtake one beat).
    db.set_ago("tether_jobs", "heartbeat_at", dropped.id, 5.0)
    await store.heartbeat("w1", _beats(kept), 60, [kept.id])
    assert await store.rescue({}) == []  # its lease still holds
    db.expire_lease(kept.id)
    db.expire_lease(dropped.id)
    [rescued] = await store.rescue({})
    assert rescued.id == dropped.id
    assert db.state(kept.id) == "running"


async def test_no_job_counts_as_dropped_when_the_beat_does_not_say_what_it_holds(
    store: Store, db: Db
) -> None:
    # A claim was out when the beat was sent: the list may lack its jobs.
    await _register(store, "w1")
    kept = await running_job(store, "w1")
    other = await running_job(store, "w1")
    db.set_ago("tether_jobs", "heartbeat_at", other.id, 5.0)
    await store.heartbeat("w1", _beats(kept), 60, None)
    db.expire_lease(other.id)
    assert await store.rescue({}) == []


async def test_a_job_claimed_as_the_beat_went_out_is_not_dropped(store: Store, db: Db) -> None:
    # Claimed after the beat before the last: its claim may have overtaken the last
    # beat (sent before the claim's answer came back), so it is not judged dropped.
    await _register(store, "w1")
    await store.heartbeat("w1", [], 60, [])
    fresh = await running_job(store, "w1")
    await store.heartbeat("w1", [], 60, [])
    db.expire_lease(fresh.id)  # a step of the clock
    assert await store.rescue({}) == []
