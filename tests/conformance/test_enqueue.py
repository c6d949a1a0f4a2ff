"""Enqueue: single and bulk inserts, input order, idempotency keys, the insert event."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from datetime import timedelta

import pytest

from tether.errors import InvalidJobError
from tether.states import JobState
from tether.store import Store

from .support import Db, assert_between, new_job


async def test_enqueue_single_job_stores_every_field(store: Store) -> None:
    args = {"url": "https://example.org", "n": [1, 2.5, None, True], "s": "häkelnadel ☃"}
    [job] = await store.enqueue(
        [
            new_job(
                "crawl",
                "web",
                args,
                priority=7,
                key="site-1",
                max_attempts=5,
                timeout=12.5,
                owner="alice",
                idempotency_key="crawl-1",
            )
        ]
    )
    assert job.id > 0
    assert (job.task, job.queue, job.args) == ("crawl", "web", args)
    assert (job.priority, job.key, job.max_attempts, job.timeout) == (7, "site-1", 5, 12.5)
    assert (job.owner, job.idempotency_key) == ("alice", "crawl-1")
    assert job.state is JobState.QUEUED
    assert (job.attempt, job.lease_token) == (0, 0)
    assert job.worker_id is None and job.lease_expires_at is None
    assert job.started_at is None and job.finished_at is None
    assert job.checkpoint is None and job.result is None and job.error is None
    assert job.cancel_requested_at is None and job.cancel_force is False
    assert job.run_at == job.created_at
    assert await store.get(job.id) == job


async def test_enqueue_uses_newjob_defaults(store: Store) -> None:
    [job] = await store.enqueue([new_job()])
    assert (job.priority, job.key, job.max_attempts, job.timeout) == (0, None, 3, None)
    assert (job.owner, job.idempotency_key) == (None, None)


async def test_enqueue_of_empty_batch_returns_empty_list(store: Store) -> None:
    assert await store.enqueue([]) == []
    assert await store.count_by_state() == {}


async def test_bulk_enqueue_returns_jobs_in_input_order(store: Store) -> None:
    batch = [
        new_job(f"t{i % 3}", f"q{i % 2}", {"i": i}, idempotency_key=f"k{i}" if i % 4 else None)
        for i in range(60)
    ]
    jobs = await store.enqueue(batch)
    assert [j.args["i"] for j in jobs] == list(range(60))
    assert [j.task for j in jobs] == [n.task for n in batch]
    assert [j.idempotency_key for j in jobs] == [n.idempotency_key for n in batch]
    assert len({j.id for j in jobs}) == 60
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    assert await store.count_by_state() == {"queued": 60}


async def test_idempotency_key_returns_the_existing_job(store: Store) -> None:
    [first] = await store.enqueue([new_job(args={"v": 1}, idempotency_key="once")])
    [again] = await store.enqueue([new_job(args={"v": 2}, idempotency_key="once")])
    assert again.id == first.id
    assert again.args == {"v": 1}
    assert await store.count_by_state() == {"queued": 1}
    assert len(await store.events(first.id)) == 1


async def test_idempotency_key_returns_existing_job_even_after_it_changed_state(
    store: Store,
) -> None:
    [first] = await store.enqueue([new_job(idempotency_key="once")])
    await store.request_cancel(first.id, "no", False, "test")
    [again] = await store.enqueue([new_job(idempotency_key="once")])
    assert again.id == first.id
    assert again.state is JobState.CANCELLED
    assert await store.count_by_state() == {"cancelled": 1}


async def test_jobs_without_an_idempotency_key_never_conflict(store: Store) -> None:
    # The key's unique index leaves keyless jobs out; each one is new, alone or among
    # keyed jobs, and a key still answers with its first job.
    [alone] = await store.enqueue([new_job(args={"v": 1})])
    batch = await store.enqueue(
        [new_job(args={"v": 1}), new_job(args={"v": 1}, idempotency_key="k"), new_job()]
    )
    again = await store.enqueue([new_job(args={"v": 2}, idempotency_key="k"), new_job()])
    assert again[0].id == batch[1].id and again[0].args == {"v": 1}
    made = [alone, batch[0], batch[2], again[1]]
    assert len({j.id for j in made} | {batch[1].id}) == 5
    assert all(j.idempotency_key is None for j in made)
    assert await store.count_by_state() == {"queued": 5}


async def test_idempotency_key_answers_before_dependencies_are_checked(store: Store) -> None:
    [dep] = await store.enqueue([new_job(queue="up")])
    [first] = await store.enqueue([new_job(idempotency_key="once", depends_on=(dep.id,))])
    assert first.state is JobState.BLOCKED
    await store.request_cancel(dep.id, "no", False, "test")
    after = await store.get(first.id)
    assert after is not None and after.state is JobState.CANCELLED
    # A retried request gets the first one's answer, though its dependency is now dead;
    # so does an entry of a batch.
    [again] = await store.enqueue([new_job(idempotency_key="once", depends_on=(dep.id,))])
    assert again == after
    batch = await store.enqueue(
        [new_job(queue="other"), new_job(idempotency_key="once", depends_on=(dep.id,))]
    )
    assert batch[1] == after
    # Without a known key, the dead dependency is refused as before.
    with pytest.raises(InvalidJobError, match="cancelled"):
        await store.enqueue([new_job(idempotency_key="other", depends_on=(dep.id,))])


async def test_idempotency_key_repeated_within_one_batch_creates_one_job(store: Store) -> None:
    [old] = await store.enqueue([new_job(args={"old": True}, idempotency_key="old")])
    batch = [
        new_job(args={"i": 0}, idempotency_key="dup"),
        new_job(args={"i": 1}),
        new_job(args={"i": 2}, idempotency_key="dup"),
        new_job(args={"i": 3}, idempotency_key="old"),
        new_job(args={"i": 4}, idempotency_key="new"),
        new_job(args={"i": 5}, idempotency_key="old"),
        new_job(args={"i": 6}),
    ]
    jobs = await store.enqueue(batch)
    assert len(jobs) == len(batch)
    assert jobs[0].id == jobs[2].id and jobs[2].args == {"i": 0}
    assert jobs[3].id == jobs[5].id == old.id and jobs[3].args == {"old": True}
    assert jobs[4].args == {"i": 4} and jobs[1].args == {"i": 1} and jobs[6].args == {"i": 6}
    assert len({jobs[i].id for i in (0, 1, 4, 6)}) == 4
    # old + dup + i=1 + new + i=6
    assert await store.count_by_state() == {"queued": 5}


async def test_concurrent_enqueues_with_one_key_create_one_job(
    store: Store, make_store: Callable[[], Store]
) -> None:
    producers = [make_store() for _ in range(8)]
    for p in producers:
        await p.open()
    results = await asyncio.gather(
        *(
            p.enqueue([new_job(args={"by": n}), new_job(args={"by": n}, idempotency_key="k")])
            for n, p in enumerate(producers)
        )
    )
    keyed = {jobs[1].id for jobs in results}
    assert len(keyed) == 1
    [winner_id] = keyed
    winner = await store.get(winner_id)
    assert winner is not None and winner.idempotency_key == "k"
    assert all(jobs[1].args == winner.args for jobs in results)
    # one keyed job plus one unkeyed job per producer
    assert await store.count_by_state() == {"queued": 1 + len(producers)}
    assert len(await store.events(winner_id)) == 1


async def test_concurrent_bulk_enqueues_with_overlapping_keys_all_succeed(
    store: Store, make_store: Callable[[], Store]
) -> None:
    producers = [make_store() for _ in range(6)]
    for p in producers:
        await p.open()
    rng = random.Random(7)
    for round_ in range(8):
        keys = [f"r{round_}-k{i}" for i in range(40)]
        orders = [rng.sample(keys, len(keys)) for _ in producers]
        results = await asyncio.gather(
            *(
                p.enqueue([new_job(idempotency_key=k) for k in order])
                for p, order in zip(producers, orders, strict=True)
            )
        )
        by_key: dict[str, set[int]] = {}
        for order, jobs in zip(orders, results, strict=True):
            assert [j.idempotency_key for j in jobs] == order
            for j in jobs:
                by_key.setdefault(j.idempotency_key or "", set()).add(j.id)
        assert all(len(found) == 1 for found in by_key.values())
        assert len(by_key) == len(keys)
    assert await store.count_by_state() == {"queued": 8 * 40}


async def test_enqueue_records_insert_event_with_database_time(store: Store, db: Db) -> None:
    before = db.now()
    [job] = await store.enqueue([new_job()])
    after = db.now()
    [event] = await store.events(job.id)
    assert event.job_id == job.id
    assert (event.from_state, event.to_state) == (None, JobState.QUEUED)
    assert event.worker_id is None
    assert event.actor == "enqueue"
    assert_between(event.at, before, after)
    assert event.at == job.created_at


async def test_enqueue_with_delay_sets_run_at_after_created_at(store: Store) -> None:
    [job] = await store.enqueue([new_job(delay=30.0)])
    assert abs((job.run_at - job.created_at) - timedelta(seconds=30)) < timedelta(milliseconds=2)
    assert job.state is JobState.QUEUED


async def test_bulk_enqueue_accepts_int_and_float_delays_and_timeouts_together(
    store: Store,
) -> None:
    jobs = await store.enqueue(
        [
            new_job(args={"i": 0}, delay=0.0, timeout=1.5),
            new_job(args={"i": 1}, delay=60, timeout=30),
            new_job(args={"i": 2}),
        ]
    )
    assert [j.timeout for j in jobs] == [1.5, 30.0, None]
    assert jobs[1].run_at - jobs[1].created_at > timedelta(seconds=59)
    assert jobs[0].run_at == jobs[0].created_at


async def test_linked_batch_with_idempotency_keys_links_to_the_jobs_the_keys_name(
    store: Store,
) -> None:
    [old] = await store.enqueue([new_job(idempotency_key="a")])
    batch = [
        new_job(idempotency_key="a"),  # the job already there
        new_job(depends_on_batch=(0,)),  # so: depends on it
        new_job(idempotency_key="z"),
        new_job(idempotency_key="z"),  # the same new job as the entry before
        new_job(depends_on_batch=(3,), depends_on=(old.id,)),
    ]
    out = await store.enqueue(batch)
    assert out[0] == old
    assert out[2] == out[3] and out[2].id > old.id
    assert [j.state for j in out] == [JobState.QUEUED, JobState.BLOCKED] + [JobState.QUEUED] * 2 + [
        JobState.BLOCKED
    ]
    assert len({out[1].id, out[2].id, out[4].id, old.id}) == 4
    assert await store.dependencies(out[1].id) == ([old.id], [])
    assert await store.dependencies(out[4].id) == (sorted([old.id, out[2].id]), [])
    upstream, dependents = await store.dependencies(old.id)
    assert (upstream, sorted(dependents)) == ([], [out[1].id, out[4].id])
    # Nothing else was written: one new job per distinct entry.
    assert sum((await store.count_by_state()).values()) == 4
