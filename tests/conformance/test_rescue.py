"""Rescue: fenced recovery of running jobs whose lease expired or whose worker died."""

from __future__ import annotations

import asyncio
import os

from tether.job import Job
from tether.states import JobState
from tether.store import Store

from .support import (
    Db,
    assert_between,
    claim_one,
    enqueue_one,
    fresh_queue,
    outcome,
    running_job,
)


async def rescue_until(store: Store, job_id: int, deadline: float = 5.0) -> Job:
    """Poll ``rescue()`` until it returns ``job_id``; fail after ``deadline`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while loop.time() < end:
        for job in await store.rescue():
            if job.id == job_id:
                return job
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} was not rescued within {deadline}s")


async def test_expired_lease_moves_job_to_retrying_and_counts_the_attempt(
    store: Store, db: Db
) -> None:
    job = await running_job(store, "w-lost", queue="q", max_attempts=3, lease=0.05)
    before = db.now()
    rescued = await rescue_until(store, job.id)
    assert rescued.state is JobState.RETRYING
    assert rescued.attempt == 1
    assert rescued.lease_token == job.lease_token + 1
    assert rescued.lease_expires_at is None and rescued.finished_at is None
    assert rescued.error is not None and "w-lost" in rescued.error
    assert_between(rescued.run_at, before, db.now())
    assert await store.get(job.id) == rescued
    # Claimable again at once; the crash counted, so this is the second attempt.
    again = await claim_one(store, "w2", queue="q")
    assert (again.id, again.attempt, again.lease_token) == (job.id, 2, job.lease_token + 2)


async def test_expired_lease_with_attempts_spent_moves_job_to_failed(store: Store, db: Db) -> None:
    job = await running_job(store, "w1", queue="q", max_attempts=1)
    db.expire_lease(job.id)
    before = db.now()
    [rescued] = await store.rescue()
    assert rescued.state is JobState.FAILED
    assert_between(rescued.finished_at, before, db.now())
    assert rescued.lease_expires_at is None
    assert await store.claim("w2", ["q"], ["t"], 1, 60) == []


async def test_a_poison_job_fails_after_max_attempts_crashes(store: Store, db: Db) -> None:
    job = await running_job(store, "w1", queue="q", max_attempts=2)
    db.expire_lease(job.id)
    assert [j.state for j in await store.rescue()] == [JobState.RETRYING]
    second = await claim_one(store, "w2", queue="q")
    db.expire_lease(second.id)
    assert [j.state for j in await store.rescue()] == [JobState.FAILED]
    events = await store.events(job.id)
    assert [e.to_state.value for e in events] == [
        "queued",
        "running",
        "retrying",
        "running",
        "failed",
    ]


async def test_expired_lease_with_a_pending_cancel_moves_job_to_cancelled(
    store: Store, db: Db
) -> None:
    job = await running_job(store, "w1", queue="q", max_attempts=5)
    await store.request_cancel(job.id, "stop", False, "alice")
    db.expire_lease(job.id)
    [rescued] = await store.rescue()
    assert rescued.state is JobState.CANCELLED
    assert rescued.finished_at is not None
    last = (await store.events(job.id))[-1]
    assert (last.from_state, last.to_state, last.actor) == ("running", "cancelled", "rescuer")
    assert await store.claim("w2", ["q"], ["t"], 1, 60) == []


async def test_job_of_a_dead_worker_is_rescued_before_its_lease_expires(store: Store) -> None:
    await store.register_worker("w-dead", None, "h", os.getpid(), None, ["q"], 1)
    await store.register_worker("w-live", None, "h", os.getpid(), None, ["q"], 1)
    doomed = await running_job(store, "w-dead", lease=3600)
    safe = await running_job(store, "w-live", lease=3600)
    assert await store.rescue() == []
    await store.set_worker_state("w-dead", "dead")
    rescued = await store.rescue()
    assert [j.id for j in rescued] == [doomed.id]
    assert rescued[0].state is JobState.RETRYING
    assert rescued[0].lease_token == doomed.lease_token + 1
    last = (await store.events(doomed.id))[-1]
    assert (last.actor, last.reason) == ("rescuer", "worker dead")
    assert await store.get(safe.id) == safe


async def test_a_live_job_with_a_valid_lease_is_never_rescued(store: Store, db: Db) -> None:
    await store.register_worker("w1", None, "h", os.getpid(), None, ["q"], 1)
    short = await running_job(store, "w1", lease=5)
    long = await running_job(store, "w1", lease=3600)
    expired = await running_job(store, "w1", lease=3600)
    db.expire_lease(expired.id)
    assert [j.id for j in await store.rescue()] == [expired.id]
    assert await store.rescue() == []
    assert await store.get(short.id) == short
    assert await store.get(long.id) == long


async def test_rescue_ignores_jobs_that_are_not_running(store: Store) -> None:
    await store.register_worker("w1", None, "h", os.getpid(), None, ["q"], 1)
    done = await running_job(store, "w1")
    await store.finish("w1", [outcome(done, JobState.SUCCEEDED)])
    waiting = await running_job(store, "w1")
    await store.finish("w1", [outcome(waiting, JobState.RETRYING, delay=60)])
    await store.set_worker_state("w1", "dead")
    before = {j.id: await store.get(j.id) for j in (done, waiting)}
    assert await store.rescue() == []
    assert {j.id: await store.get(j.id) for j in (done, waiting)} == before


async def test_rescue_of_a_released_lease_happens_once(store: Store, db: Db) -> None:
    job = await running_job(store, "w1")
    db.expire_lease(job.id)
    assert len(await store.rescue()) == 1
    assert await store.rescue() == []
    after = await store.get(job.id)
    assert after is not None and after.lease_token == job.lease_token + 1


async def test_a_recovered_job_without_a_checkpoint_goes_behind_every_job_already_waiting(
    store: Store, db: Db
) -> None:
    # The rescue follows the enqueue at once, often within one tick of SQLite's clock:
    # the order must come from the store's rule, not from the clock telling them apart.
    for _ in range(20):
        queue = fresh_queue()
        lost = await running_job(store, "w-lost", queue=queue)
        db.expire_lease(lost.id)
        waiting = await enqueue_one(store, queue=queue)
        assert [j.id for j in await store.rescue()] == [lost.id]
        assert (await claim_one(store, "w2", queue=queue)).id == waiting.id
        # Its turn comes within one tick of the clock after the job it queued behind.
        loop = asyncio.get_running_loop()
        end = loop.time() + 5
        claimed: list[Job] = []
        while not claimed and loop.time() < end:
            claimed = await store.claim("w2", [queue], ["t"], 1, 60)
        assert [j.id for j in claimed] == [lost.id]
