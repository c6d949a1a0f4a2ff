"""Rate limits: a token bucket per queue or task, spent inside the claim on every store.

Time is driven through the database: a bucket's ``refilled_at`` is moved into the past
instead of sleeping, and the rates are so slow that the real time a test takes refills
far less than one token.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import psycopg
import pytest

from tether.job import Job
from tether.store import Store, create_store

from .support import Db, new_job

SLOW = 0.001  # tokens a second: under one token in 15 minutes of real time


async def _jobs(
    store: Store, n: int, *, queue: str = "a", task: str = "t", **fields: object
) -> None:
    await store.enqueue([new_job(task=task, queue=queue, **fields) for _ in range(n)])


async def _claim(store: Store, worker: str = "w1", queues: tuple[str, ...] = ("a",),
                 tasks: tuple[str, ...] = ("t",), limit: int = 50) -> list[str]:  # fmt: skip
    return [j.queue + "/" + j.task for j in await store.claim(worker, queues, tasks, limit, 60.0)]


async def test_claims_beyond_the_burst_are_refused_across_workers(store: Store) -> None:
    await store.set_rate_limit("queue", "a", SLOW, 3)
    await _jobs(store, 10)
    assert len(await _claim(store, "w1", limit=2)) == 2
    assert len(await _claim(store, "w2")) == 1  # the same bucket, whichever worker asks
    assert await _claim(store, "w1") == []
    assert await _claim(store, "w2") == []
    [limit] = await store.list_rate_limits()
    assert (limit.scope, limit.name, limit.burst, int(limit.tokens)) == ("queue", "a", 3, 0)


async def test_the_bucket_refills_with_database_time_up_to_the_burst(store: Store, db: Db) -> None:
    await store.set_rate_limit("queue", "a", SLOW, 3)
    await _jobs(store, 20)
    assert len(await _claim(store)) == 3
    db.set_ago("tether_rate_limits", "refilled_at", "queue:a", 2 / SLOW + 1)  # two tokens' worth
    assert len(await _claim(store)) == 2
    assert await _claim(store) == []
    db.set_ago("tether_rate_limits", "refilled_at", "queue:a", 1000 / SLOW)  # far more than burst
    assert len(await _claim(store)) == 3


async def test_other_queues_and_tasks_are_not_held_back(store: Store) -> None:
    await store.set_rate_limit("queue", "a", SLOW, 1)
    await _jobs(store, 3, queue="a")
    await _jobs(store, 3, queue="b")
    taken = Counter(await _claim(store, queues=("a", "b")))
    assert taken == {"a/t": 1, "b/t": 3}


async def test_a_task_limit_holds_on_every_queue_and_combines_with_a_queue_limit(
    store: Store,
) -> None:
    await store.set_rate_limit("task", "slow", SLOW, 2)
    await store.set_rate_limit("queue", "b", SLOW, 1)
    await _jobs(store, 3, queue="a", task="slow")
    await _jobs(store, 3, queue="b", task="slow")
    await _jobs(store, 3, queue="b", task="fast")
    taken = Counter(await _claim(store, queues=("a", "b"), tasks=("slow", "fast")))
    # Two of slow in all (its bucket), one job from queue b in all (its bucket).
    assert sum(n for k, n in taken.items() if k.endswith("/slow")) == 2
    assert sum(n for k, n in taken.items() if k.startswith("b/")) == 1
    assert sum(taken.values()) == 3


async def test_a_job_held_back_by_its_concurrency_key_spends_no_token(store: Store) -> None:
    await store.set_rate_limit("queue", "a", SLOW, 5)
    await _jobs(store, 3, key="k", limits=("key:k",))
    assert len(await _claim(store)) == 1  # one running job per key
    assert await _claim(store) == []
    [limit] = await store.list_rate_limits()
    assert int(limit.tokens) == 4


async def test_changing_or_removing_a_limit(store: Store) -> None:
    await store.set_rate_limit("queue", "a", SLOW, 1)
    await _jobs(store, 5)
    assert len(await _claim(store)) == 1
    await store.set_rate_limit("queue", "a", SLOW, 2)  # a changed limit starts full
    assert len(await _claim(store)) == 2
    assert await store.remove_rate_limit("queue", "a")
    assert not await store.remove_rate_limit("queue", "a")
    assert len(await _claim(store)) == 2
    assert await store.list_rate_limits() == []


async def test_a_rate_limit_keeps_the_claim_in_priority_order(store: Store) -> None:
    # A limit on one queue must not let its low-priority jobs go ahead of others.
    await store.set_rate_limit("queue", "a", SLOW, 100)
    await _jobs(store, 2, queue="a", priority=0)
    await _jobs(store, 2, queue="b", priority=100)
    assert await _claim(store, queues=("a", "b"), limit=3) == ["b/t", "b/t", "a/t"]
    [limit] = await store.list_rate_limits()
    assert int(limit.tokens) == 99  # the limited queue's job spent one token


# -- at a rate where a refill error shows -----------------------------------------------

RATE, BURST = 5.0, 5  # tokens a second, and the bucket's size
CLAIMERS = 6  # stores, each with its own connections, claiming at once
STARTS = 16  # jobs to start: about two seconds' worth beyond the burst


async def test_concurrent_claimers_never_start_more_than_the_bucket_allows(
    store: Store, make_store: Callable[[], Store]
) -> None:
    stores = [store, *(make_store() for _ in range(CLAIMERS - 1))]
    for s in stores:
        await s.open()
    await stores[0].set_rate_limit("queue", "a", RATE, BURST)
    await _jobs(stores[0], STARTS + 10)
    started: list[Job] = []

    async def claimer(s: Store, n: int) -> None:
        while len(started) < STARTS:
            started.extend(await s.claim(f"w{n}", ["a"], ["t"], 2, 60.0))

    await asyncio.gather(*(claimer(s, n) for n, s in enumerate(stores)))
    # The claims' own database timestamps. On PostgreSQL started_at is the start of the
    # claim's transaction, earlier than the moment it held the bucket by however long
    # it waited for it: one token's worth of slack (200 ms) covers that.
    times = sorted(j.started_at.timestamp() for j in started if j.started_at is not None)
    assert len(times) == len(started)
    worst = max(
        (j - i + 1) - (BURST + RATE * (times[j] - times[i]))
        for i in range(len(times))
        for j in range(i, len(times))
    )
    assert worst <= 1.0, f"{worst:.2f} more jobs started in one window than the bucket holds"


async def test_a_claim_never_moves_a_buckets_clock_back(store: Store, db: Db) -> None:
    # The last refill was written by a clock ahead of this one (another SQLite process,
    # a server clock stepped back): this claim refills nothing and leaves it there.
    await store.set_rate_limit("queue", "a", RATE, 2)
    await _jobs(store, 5)
    db.set_ago("tether_rate_limits", "refilled_at", "queue:a", -10.0)
    db.execute("UPDATE tether_rate_limits SET tokens = 1 WHERE id = %s", ("queue:a",))
    ahead = db.execute("SELECT refilled_at FROM tether_rate_limits")[0][0]
    assert len(await _claim(store)) == 1
    assert db.execute("SELECT refilled_at, tokens FROM tether_rate_limits")[0] == (ahead, 0)
    assert await _claim(store) == []


@pytest.mark.postgres
async def test_a_bucket_held_by_another_client_never_stalls_the_claim(pg_url: str) -> None:
    # An operator's (or a caller's) transaction holds a rate bucket's row: the claim
    # takes everything else at once and leaves only that bucket's work for later.
    store = create_store(pg_url)
    await store.open()
    try:
        await store.migrate()
        await store.set_rate_limit("task", "paced", 5.0, 5)
        await _jobs(store, 3, task="paced")
        await _jobs(store, 3, task="free")
        for mode in ("FOR UPDATE", "FOR SHARE", "FOR NO KEY UPDATE"):
            with psycopg.connect(pg_url) as holder:
                holder.execute(f"SELECT 1 FROM tether_rate_limits WHERE id = 'task:paced' {mode}")
                claimed = await asyncio.wait_for(
                    store.claim("w1", ["a"], ["paced", "free"], 10, 60.0), 10
                )
                assert all(j.task == "free" for j in claimed), mode
                holder.rollback()
        claimed = await store.claim("w1", ["a"], ["paced"], 10, 60.0)
        assert len(claimed) == 3
        [bucket] = await store.list_rate_limits()
        assert int(bucket.tokens) == 2
    finally:
        await store.close()
