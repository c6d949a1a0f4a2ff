"""The state machine: legal transitions work and leave events; illegal ones are refused.

Refusal is shown twice: through the Store API (nothing changes) and in raw SQL, where the
trigger and the CHECK constraints hold even for statements written by hand.
"""

from __future__ import annotations

from collections import deque

import pytest

from tether.job import Job, JobEvent, Outcome
from tether.states import TERMINAL, TRANSITIONS, JobState, transition_pairs
from tether.store import Store

from .support import (
    DB_ERRORS,
    SQLITE_NOW,
    Db,
    claim_one,
    enqueue_one,
    fresh_queue,
    new_job,
    outcome,
    running_job,
    unnumbered,
)

Q, B, R, RT, P, S, F, C = (
    JobState.QUEUED,
    JobState.BLOCKED,
    JobState.RUNNING,
    JobState.RETRYING,
    JobState.PAUSED,
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
)


def pairs(events: list[JobEvent]) -> list[tuple[str | None, str]]:
    return [(e.from_state and e.from_state.value, e.to_state.value) for e in events]


# -- through the Store API -------------------------------------------------------------


async def test_claim_moves_queued_to_running_with_event(store: Store) -> None:
    job = await enqueue_one(store)
    claimed = await claim_one(store, "w-claim")
    assert claimed.id == job.id
    events = await store.events(job.id)
    assert pairs(events) == [(None, "queued"), ("queued", "running")]
    last = events[-1]
    assert (last.worker_id, last.actor, last.reason) == ("w-claim", "worker", None)
    assert last.at >= events[0].at


@pytest.mark.parametrize("target", [S, F, RT, Q, C], ids=lambda s: s.value)
async def test_finish_moves_running_job_to_outcome_state_with_event(
    store: Store, target: JobState
) -> None:
    job = await running_job(store, "w-fin")
    accepted = await store.finish("w-fin", [outcome(job, target, reason=f"to {target}")])
    assert accepted == {job.id}
    after = await store.get(job.id)
    assert after is not None and after.state is target
    events = await store.events(job.id)
    assert pairs(events)[-1] == ("running", target.value)
    last = events[-1]
    assert (last.worker_id, last.actor, last.reason) == ("w-fin", "w-fin", f"to {target}")


async def test_claim_moves_retrying_to_running_with_event(store: Store) -> None:
    job = await running_job(store, "w1", queue="q")
    await store.finish("w1", [outcome(job, RT, error="boom")])
    again = await claim_one(store, "w2", queue="q")
    assert again.id == job.id and again.state is R
    events = await store.events(job.id)
    assert pairs(events) == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "retrying"),
        ("retrying", "running"),
    ]
    assert [e.worker_id for e in events] == [None, "w1", "w1", "w2"]


async def make(store: Store, state: JobState) -> Job:
    """A job in ``state``, reached through the Store API only."""
    if state is Q:
        return await enqueue_one(store, queue=fresh_queue())
    if state is B:
        dep = await enqueue_one(store, queue=fresh_queue())
        job = await enqueue_one(store, queue=fresh_queue(), depends_on=(dep.id,))
        assert job.state is B
        return job
    if state is P:
        job = await store.request_pause((await make(store, Q)).id, "hold", "alice")
        assert job.state is P
        return job
    job = await running_job(store, "w1")
    if state is R:
        return job
    assert state in (RT, F)
    assert await store.finish("w1", [outcome(job, state)]) == {job.id}
    got = await store.get(job.id)
    assert got is not None and got.state is state
    return got


async def over_budget_paused(store: Store) -> Job:
    """A job its worker paused because it used more than its budget."""
    job = await running_job(store, "w1", budget=10)
    paused = outcome(job, P, usage=11, stopped_by="budget")
    assert await store.finish("w1", [paused]) == {job.id}
    got = await store.get(job.id)
    assert got is not None and got.state is P
    return got


async def move(store: Store, job: Job, dst: JobState) -> None:
    """Make ``job`` take the ``job.state -> dst`` transition the way tether does."""
    src = job.state
    if dst is R:
        await claim_one(store, "w2", queue=job.queue)
    elif src is R and dst is P:
        await store.request_pause(job.id, "hold", "alice")
        assert await store.finish("w1", [outcome(job, P)]) == {job.id}
    elif src is R and dst is B:
        child = await store.spawn(job.id, job.lease_token, new_job(queue=fresh_queue()))
        assert child is not None
        assert await store.finish("w1", [outcome(job, B)]) == {job.id}
    elif src is R:
        assert await store.finish("w1", [outcome(job, dst)]) == {job.id}
    elif dst is P:
        await store.request_pause(job.id, "hold", "alice")
    elif src is P and dst is Q:
        await store.resume(job.id, None, "alice")
    elif dst in (C, F):
        # A job paused over its budget fails when cancelled: its work was not done.
        await store.request_cancel(job.id, "stop", False, "alice")
    elif src is F and dst is Q:
        await store.retry(job.id, "alice")
    elif src is B and dst is Q:
        [dep_id], _ = await store.dependencies(job.id)
        dep = await store.get(dep_id)
        assert dep is not None
        running = await claim_one(store, "w3", queue=dep.queue)
        assert await store.finish("w3", [outcome(running, S)]) == {dep_id}
    else:
        raise AssertionError(f"no Store API path for {src} -> {dst}: add one here")


@pytest.mark.parametrize("pair", transition_pairs(), ids="->".join)
async def test_every_legal_transition_works_through_the_store_api_with_an_event(
    store: Store, pair: tuple[str, str]
) -> None:
    src, dst = JobState(pair[0]), JobState(pair[1])
    job = await (over_budget_paused(store) if (src, dst) == (P, F) else make(store, src))
    before = await store.events(job.id)
    await move(store, job, dst)
    after = await store.get(job.id)
    assert after is not None and after.state is dst
    events = await store.events(job.id)
    # The same history, and one transition more (a claim read off the row until now
    # may have been stored meanwhile: it has an id now).
    assert unnumbered(events[: len(before)]) == unnumbered(before)
    assert pairs(events[len(before) :]) == [(src.value, dst.value)]
    assert events[-1].at >= before[-1].at
    assert events[-1].actor is not None


async def test_rescue_moves_expired_running_job_to_retrying_with_event(
    store: Store, db: Db
) -> None:
    job = await running_job(store, "w-lost")
    db.expire_lease(job.id)
    assert [j.id for j in await store.rescue()] == [job.id]
    last = (await store.events(job.id))[-1]
    assert (last.from_state, last.to_state) == (R, RT)
    assert (last.worker_id, last.actor, last.reason) == ("w-lost", "rescuer", "lease expired")


async def test_finish_on_a_queued_job_is_refused_and_changes_nothing(store: Store) -> None:
    job = await enqueue_one(store)
    for state in (S, F, RT, Q, C):
        for token in (0, 1):
            late = Outcome(job.id, token, state, result_json="1", error="x")
            assert await store.finish("w1", [late]) == set()
    assert await store.get(job.id) == job
    assert pairs(await store.events(job.id)) == [(None, "queued")]


async def test_finish_on_a_succeeded_job_is_refused_and_changes_nothing(store: Store) -> None:
    job = await running_job(store, "w1")
    assert await store.finish("w1", [outcome(job, S, result_json='"first"')]) == {job.id}
    done = await store.get(job.id)
    for state in (S, F, RT, Q, C):
        assert await store.finish("w1", [outcome(job, state, result_json='"late"')]) == set()
    assert await store.get(job.id) == done
    assert done is not None and done.result == "first"
    assert len(await store.events(job.id)) == 3


# -- in raw SQL --------------------------------------------------------------------------


async def test_transition_table_in_database_matches_states_module(store: Store, db: Db) -> None:
    rows = db.execute("SELECT from_state, to_state FROM tether_transitions")
    assert sorted(tuple(r) for r in rows) == transition_pairs()


async def test_sql_update_from_succeeded_to_running_is_refused_by_trigger(
    store: Store, db: Db
) -> None:
    job = await running_job(store, "w1")
    await store.finish("w1", [outcome(job, S)])
    # Give it a lease too, so only the transition rule can object.
    with pytest.raises(DB_ERRORS, match="illegal transition"):
        db.execute(
            "UPDATE tether_jobs SET state = 'running', lease_expires_at = run_at WHERE id = %s",
            (job.id,),
        )
    assert db.state(job.id) == "succeeded"
    assert len(await store.events(job.id)) == 3


async def test_sql_update_from_cancelled_to_queued_is_refused_by_trigger(
    store: Store, db: Db
) -> None:
    job = await enqueue_one(store)
    await store.request_cancel(job.id, None, False, None)
    with pytest.raises(DB_ERRORS, match="illegal transition"):
        db.execute("UPDATE tether_jobs SET state = 'queued' WHERE id = %s", (job.id,))
    assert db.state(job.id) == "cancelled"


async def test_sql_update_to_a_state_outside_the_check_is_refused(store: Store, db: Db) -> None:
    job = await enqueue_one(store)
    with pytest.raises(DB_ERRORS, match=r"(?i)check constraint"):
        db.execute("UPDATE tether_jobs SET state = 'exploded' WHERE id = %s", (job.id,))
    assert db.state(job.id) == "queued"
    assert len(await store.events(job.id)) == 1


async def test_sql_insert_of_a_job_that_starts_running_is_refused(store: Store, db: Db) -> None:
    with pytest.raises(DB_ERRORS, match="start"):
        db.execute(
            "INSERT INTO tether_jobs (task, args, queue, state, max_attempts, run_at, "
            "created_at, lease_expires_at) "
            "SELECT task, args, queue, 'succeeded', 1, run_at, created_at, NULL "
            "FROM tether_jobs WHERE id = %s",
            ((await enqueue_one(store)).id,),
        )
    assert await store.count_by_state() == {"queued": 1}


def _paths_from_queued() -> dict[JobState, list[JobState]]:
    """A shortest legal path from ``queued`` to every reachable state."""
    paths = {Q: [Q]}
    todo = deque([Q])
    while todo:
        src = todo.popleft()
        for dst in sorted(TRANSITIONS[src]):
            if dst not in paths:
                paths[dst] = [*paths[src], dst]
                todo.append(dst)
    return paths


def _sql_move(db: Db, job_id: int, state: JobState) -> None:
    """Set a state by hand, with the lease the CHECK demands of it, and the start and
    end times the store records (a job's history reads its claim and success off them)."""
    lease = "run_at" if state is R else "NULL"
    # A claim starts at the database's now: each run its own start.
    now = "now()" if db.dialect == "postgresql" else SQLITE_NOW
    started = now if state is R else "started_at"
    finished = "run_at" if state in TERMINAL else "NULL"
    db.execute(
        f"UPDATE tether_jobs SET state = %s, lease_expires_at = {lease}, "
        f"started_at = {started}, finished_at = {finished} WHERE id = %s",
        (state.value, job_id),
    )


async def test_trigger_accepts_exactly_the_legal_transitions(store: Store, db: Db) -> None:
    paths = _paths_from_queued()
    assert set(paths) == set(JobState)
    for src in JobState:
        for dst in JobState:
            if src is dst:
                continue
            job = await enqueue_one(store)
            for step in paths[src][1:]:
                _sql_move(db, job.id, step)
            if dst in TRANSITIONS[src]:
                _sql_move(db, job.id, dst)
                expected = [Q, *paths[src][1:], dst]
            else:
                with pytest.raises(DB_ERRORS, match="illegal transition"):
                    _sql_move(db, job.id, dst)
                expected = [Q, *paths[src][1:]]
            events = await store.events(job.id)
            assert [e.to_state for e in events] == expected, (src, dst)
            assert [e.from_state for e in events] == [None, *expected[:-1]], (src, dst)
            assert db.state(job.id) == expected[-1].value


# -- the lease CHECK ---------------------------------------------------------------------


async def test_sql_running_without_a_lease_is_refused(store: Store, db: Db) -> None:
    queued = await enqueue_one(store)
    with pytest.raises(DB_ERRORS, match="lease_iff_running"):
        db.execute("UPDATE tether_jobs SET state = 'running' WHERE id = %s", (queued.id,))
    running = await running_job(store, "w1")
    with pytest.raises(DB_ERRORS, match="lease_iff_running"):
        db.execute("UPDATE tether_jobs SET lease_expires_at = NULL WHERE id = %s", (running.id,))
    assert db.state(queued.id) == "queued"
    after = await store.get(running.id)
    assert after == running


async def test_sql_lease_on_a_job_that_is_not_running_is_refused(store: Store, db: Db) -> None:
    queued = await enqueue_one(store)
    done = await running_job(store, "w1")
    await store.finish("w1", [outcome(done, S)])
    for job_id in (queued.id, done.id):
        with pytest.raises(DB_ERRORS, match="lease_iff_running"):
            db.execute("UPDATE tether_jobs SET lease_expires_at = run_at WHERE id = %s", (job_id,))
    running = await running_job(store, "w2")
    # Leaving running while keeping the lease is refused as well.
    with pytest.raises(DB_ERRORS, match="lease_iff_running"):
        db.execute("UPDATE tether_jobs SET state = 'succeeded' WHERE id = %s", (running.id,))
    assert db.state(running.id) == "running"
    rows = db.execute("SELECT COUNT(*) FROM tether_jobs WHERE lease_expires_at IS NOT NULL")
    assert rows[0][0] == 1
