"""Claim: batch limit, order, due time, queue and task filters, lease fields, no sharing."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

from tether.job import Job, JobFilter
from tether.states import JobState
from tether.store import Store
from tether.store.postgres import PostgresStore

from .support import Db, assert_between, claim_one, enqueue_one, new_job, outcome


async def test_claim_returns_at_most_the_batch_limit(store: Store) -> None:
    await store.enqueue([new_job(args={"i": i}) for i in range(10)])
    sizes, seen = [], set()
    for _ in range(5):
        jobs = await store.claim("w1", ["default"], ["t"], 3, 60)
        sizes.append(len(jobs))
        seen |= {j.id for j in jobs}
    assert sizes == [3, 3, 3, 1, 0]
    assert len(seen) == 10
    assert await store.count_by_state() == {"running": 10}


async def test_claim_across_queues_respects_the_limit_and_the_global_order(
    store: Store,
) -> None:
    jobs = await store.enqueue(
        [new_job(queue=f"q{i % 3}", args={"i": i}, priority=i % 4) for i in range(12)]
    )
    expected = [j.id for j in sorted(jobs, key=lambda j: (-j.priority, j.run_at, j.id))]
    got: list[int] = []
    while batch := await store.claim("w1", ["q0", "q1", "q2"], ["t"], 5, 60):
        assert len(batch) <= 5
        got.extend(j.id for j in batch)
    assert got == expected


async def test_claim_with_nothing_claimable_returns_empty_list(store: Store) -> None:
    assert await store.claim("w1", ["default"], ["t"], 5, 60) == []


async def test_claim_orders_by_priority_then_run_at_then_id(store: Store, db: Db) -> None:
    jobs = await store.enqueue(
        [new_job(args={"n": n}, priority=p) for n, p in enumerate([0, 0, 0, 5, 5, -1, 0])]
    )
    ids = [j.id for j in jobs]
    # run_at decides within a priority, whatever the id order; ties fall back to id.
    for job_id, ago in zip(ids, [10, 30, 30, 1, 20, 100, 20], strict=True):
        db.set_ago("tether_jobs", "run_at", job_id, ago)
    tied = db.execute("SELECT run_at FROM tether_jobs WHERE id IN (%s, %s)", (ids[1], ids[2]))
    db.execute("UPDATE tether_jobs SET run_at = %s WHERE id = %s", (tied[0][0], ids[2]))
    expected = [ids[i] for i in (4, 3, 1, 2, 6, 0, 5)]

    one_by_one = [(await claim_one(store)).id for _ in ids]
    assert one_by_one == expected

    # A single batch comes back in the same order.
    for job_id in ids:
        db.execute(
            "UPDATE tether_jobs SET state = 'queued', lease_expires_at = NULL WHERE id = %s",
            (job_id,),
        )
    batch = await store.claim("w2", ["default"], ["t"], len(ids), 60)
    assert [j.id for j in batch] == expected


async def test_priority_beats_an_earlier_run_at(store: Store, db: Db) -> None:
    low = await enqueue_one(store, priority=1)
    high = await enqueue_one(store, priority=2)
    db.set_ago("tether_jobs", "run_at", low.id, 3600)
    assert [j.id for j in await store.claim("w", ["default"], ["t"], 2, 60)] == [high.id, low.id]


async def test_delayed_job_is_not_claimable_until_run_at(store: Store, db: Db) -> None:
    later = await enqueue_one(store, delay=30.0)
    now = await enqueue_one(store)
    assert [j.id for j in await store.claim("w1", ["default"], ["t"], 10, 60)] == [now.id]
    assert await store.claim("w1", ["default"], ["t"], 10, 60) == []
    db.make_due(later.id)
    assert [j.id for j in await store.claim("w1", ["default"], ["t"], 10, 60)] == [later.id]


async def test_claim_takes_only_the_listed_queues_and_tasks(store: Store) -> None:
    jobs = await store.enqueue(
        [new_job("a", "q1"), new_job("b", "q1"), new_job("a", "q2"), new_job("c", "q3")]
    )
    a_q1, b_q1, a_q2, c_q3 = (j.id for j in jobs)
    assert [j.id for j in await store.claim("w", ["q1"], ["a"], 10, 60)] == [a_q1]
    assert await store.claim("w", ["q1"], ["a", "c"], 10, 60) == []
    assert await store.claim("w", ["nope"], ["a", "b", "c"], 10, 60) == []
    got = await store.claim("w", ["q1", "q2"], ["a", "b"], 10, 60)
    assert sorted(j.id for j in got) == sorted([b_q1, a_q2])
    assert (await store.get(c_q3)) == jobs[3]


async def test_claim_sets_lease_and_bumps_token_and_attempt(store: Store, db: Db) -> None:
    job = await enqueue_one(store)
    before = db.now()
    claimed = await claim_one(store, "w1", lease=45.0)
    after = db.now()
    assert claimed.id == job.id
    assert claimed.state is JobState.RUNNING
    assert (claimed.worker_id, claimed.lease_token, claimed.attempt) == ("w1", 1, 1)
    assert_between(claimed.started_at, before, after)
    assert_between(claimed.heartbeat_at, before, after)
    lease = timedelta(seconds=45)
    assert_between(claimed.lease_expires_at, before + lease, after + lease)
    assert await store.get(job.id) == claimed

    # A second attempt by another worker bumps both again.
    await store.finish("w1", [outcome(claimed, JobState.RETRYING)])
    again = await claim_one(store, "w2", lease=5.0)
    assert (again.worker_id, again.lease_token, again.attempt) == ("w2", 2, 2)
    assert again.lease_expires_at is not None and again.started_at is not None
    assert again.lease_expires_at - again.started_at < timedelta(seconds=6)


async def test_a_claimed_job_is_the_row_as_read_back(store: Store) -> None:
    # Every column survives the claim's own (faster) row reading.
    job = await enqueue_one(
        store,
        args={"n": [1, "two", None]},
        priority=3,
        key="k",
        limits=("key:k",),
        max_attempts=5,
        timeout=9.5,
        owner="ann",
        idempotency_key="idem",
        budget=40,
    )
    claimed = await claim_one(store)
    assert claimed.id == job.id and claimed.limits == ("key:k",) and claimed.budget == 40
    assert claimed == await store.get(job.id)


async def test_claim_skips_running_and_finished_jobs(store: Store) -> None:
    jobs = await store.enqueue([new_job(args={"i": i}) for i in range(4)])
    running = await store.claim("w1", ["default"], ["t"], 4, 60)
    await store.finish("w1", [outcome(running[0], JobState.SUCCEEDED)])
    await store.finish("w1", [outcome(running[1], JobState.FAILED)])
    await store.finish("w1", [outcome(running[2], JobState.CANCELLED)])
    assert await store.claim("w2", ["default"], ["t"], 10, 60) == []
    # the fourth is still running and still the first worker's
    fourth = await store.get(running[3].id)
    assert fourth is not None and fourth.worker_id == "w1" and fourth.lease_token == 1
    assert {j.id for j in jobs} == {j.id for j in running}


async def test_concurrent_claimers_never_get_the_same_job(
    store: Store, make_store: Callable[[], Store]
) -> None:
    total = 500
    await store.enqueue([new_job(args={"i": i}) for i in range(total)])
    claimers = [make_store() for _ in range(8)]
    for c in claimers:
        await c.open()

    async def drain(n: int, s: Store) -> list[Job]:
        mine: list[Job] = []
        while batch := await s.claim(f"w{n}", ["default"], ["t"], 7, 60):
            mine.extend(batch)
        return mine

    results = await asyncio.gather(*(drain(n, s) for n, s in enumerate(claimers)))
    counts = Counter(j.id for jobs in results for j in jobs)
    assert len(counts) == total
    assert max(counts.values()) == 1
    # More than one claimer took part, so the claims really overlapped.
    assert sum(1 for jobs in results if jobs) > 1
    # The database agrees: each job was claimed once, by the claimer that got it.
    owner = {j.id: f"w{n}" for n, jobs in enumerate(results) for j in jobs}
    rows = await store.list_jobs(JobFilter(limit=total + 1))
    assert len(rows) == total
    assert all(j.lease_token == 1 and j.attempt == 1 for j in rows)
    assert all(j.worker_id == owner[j.id] for j in rows)
    assert await store.count_by_state() == {"running": total}


@pytest.mark.postgres
async def test_a_key_s_next_job_never_reads_as_started_before_the_last_one_finished(
    pg_url: str,
) -> None:
    # PostgreSQL's claim is one statement running several inner ones: an inner one may
    # see a finish that committed after the statement (and its now()) began. Here a
    # transaction begun before the finish stands for that early start.
    store = PostgresStore(pg_url)
    await store.open()
    try:
        await store.announce_follower(60.0)  # the claim event is stored as well
        first = await enqueue_one(store, key="k", limits=("key:k",))
        second = await enqueue_one(store, key="k", limits=("key:k",))
        running = await claim_one(store)
        assert running.id == first.id
        with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
            conn.execute("SELECT 1")
            assert await store.finish("w1", [outcome(running, JobState.SUCCEEDED)]) == {first.id}
            claimed = conn.execute(
                "SELECT id FROM tether_claim('w2', ARRAY['default'], ARRAY['t'], 1, 60)"
            ).fetchall()
        assert claimed == [(second.id,)]
        done, started = await store.get(first.id), await store.get(second.id)
        assert done is not None and done.finished_at is not None
        assert started is not None and started.started_at is not None
        assert done.finished_at <= started.started_at
        claims = [e for e in await store.events(second.id) if e.to_state is JobState.RUNNING]
        assert [(e.at, e.id is not None) for e in claims] == [(started.started_at, True)]
    finally:
        await store.close()
