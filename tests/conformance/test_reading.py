"""Readers: get, list_jobs filters and pagination, count_by_state, events order."""

from __future__ import annotations

from tether.job import Job, JobFilter
from tether.states import JobState
from tether.store import Store

from .support import claim_one, enqueue_one, new_job, outcome, running_job


async def seed(store: Store) -> list[Job]:
    """Twelve jobs over two queues, three tasks, two keys and owners, in several states."""
    jobs = await store.enqueue(
        [
            new_job(
                f"t{i % 3}",
                f"q{i % 2}",
                {"i": i},
                key=f"k{i % 2}" if i < 6 else None,
                owner="alice" if i % 4 == 0 else "bob",
            )
            for i in range(12)
        ]
    )
    # jobs[0] (q0, t0) runs on w1; jobs[3] (q1, t0) runs on w2 then succeeds.
    assert (await claim_one(store, "w1", queue="q0", task="t0")).id == jobs[0].id
    done = await claim_one(store, "w2", queue="q1", task="t0")
    assert done.id == jobs[3].id
    await store.finish("w2", [outcome(done, JobState.SUCCEEDED)])
    await store.request_cancel(jobs[5].id, None, False, None)
    return jobs


def ids(jobs: list[Job]) -> list[int]:
    return [j.id for j in jobs]


async def test_list_jobs_returns_newest_first(store: Store) -> None:
    jobs = await seed(store)
    assert ids(await store.list_jobs(JobFilter())) == ids(jobs)[::-1]


async def test_list_jobs_filters_by_each_field(store: Store) -> None:
    jobs = await seed(store)
    by_id = {j.id: j for j in await store.list_jobs(JobFilter())}

    async def listed(**kw: object) -> set[int]:
        return set(ids(await store.list_jobs(JobFilter(**kw))))  # type: ignore[arg-type]

    assert await listed(states=(JobState.RUNNING,)) == {jobs[0].id}
    assert await listed(states=(JobState.SUCCEEDED, JobState.CANCELLED)) == {
        jobs[3].id,
        jobs[5].id,
    }
    assert await listed(queue="q1") == {j.id for j in jobs if j.queue == "q1"}
    assert await listed(task="t2") == {j.id for j in jobs if j.task == "t2"}
    assert await listed(key="k0") == {j.id for j in jobs if j.key == "k0"}
    assert await listed(owner="alice") == {jobs[0].id, jobs[4].id, jobs[8].id}
    assert await listed(worker_id="w2") == {jobs[3].id}
    assert await listed(ids=(jobs[1].id, jobs[7].id, 999999)) == {jobs[1].id, jobs[7].id}
    assert await listed(queue="q0", task="t0", states=(JobState.QUEUED,)) == {
        j.id for j in jobs if (j.queue, j.task) == ("q0", "t0") and j.id != jobs[0].id
    }
    assert await listed(queue="nope") == set()
    assert all(by_id[i].queue == "q1" for i in await listed(queue="q1"))


async def test_list_jobs_pages_with_limit_and_offset(store: Store) -> None:
    jobs = await seed(store)
    pages = [ids(await store.list_jobs(JobFilter(limit=5, offset=o))) for o in (0, 5, 10, 15)]
    assert [len(p) for p in pages] == [5, 5, 2, 0]
    assert [i for p in pages for i in p] == ids(jobs)[::-1]
    filtered = [
        ids(await store.list_jobs(JobFilter(queue="q0", limit=2, offset=o))) for o in (0, 2, 4)
    ]
    assert [i for p in filtered for i in p] == [j.id for j in reversed(jobs) if j.queue == "q0"]


async def test_count_by_state_counts_only_present_states(store: Store) -> None:
    await seed(store)
    assert await store.count_by_state() == {
        "queued": 9,
        "running": 1,
        "succeeded": 1,
        "cancelled": 1,
    }


async def test_jobs_in_every_state_are_counted_and_listed_by_state(store: Store) -> None:
    # On PostgreSQL the succeeded jobs have no entry in the index by state: they are
    # listed from the primary key and counted as the rest of the table.
    by_state: dict[JobState, set[int]] = {s: set() for s in JobState}

    async def ended(state: JobState) -> None:
        job = await running_job(store)
        await store.finish("w1", [outcome(job, state, delay=3600.0)])
        by_state[state].add(job.id)

    for state in (JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.FAILED, JobState.RETRYING):
        await ended(state)
    by_state[JobState.RUNNING].add((await running_job(store)).id)
    upstream = await enqueue_one(store)
    by_state[JobState.QUEUED].add(upstream.id)
    by_state[JobState.BLOCKED].add((await enqueue_one(store, depends_on=(upstream.id,))).id)
    paused = await store.request_pause((await enqueue_one(store)).id, None, None)
    by_state[JobState.PAUSED].add(paused.id)
    cancelled = await store.request_cancel((await enqueue_one(store)).id, None, False, None)
    by_state[JobState.CANCELLED].add(cancelled.id)

    assert await store.count_by_state() == {s.value: len(i) for s, i in by_state.items()}
    for state, expected in by_state.items():
        assert set(ids(await store.list_jobs(JobFilter(states=(state,))))) == expected
    assert await store.list_jobs(JobFilter(states=())) == []


async def test_count_by_state_of_succeeded_jobs_alone_and_of_none(store: Store) -> None:
    assert await store.count_by_state() == {}
    job = await running_job(store)
    await store.finish("w1", [outcome(job, JobState.SUCCEEDED)])
    assert await store.count_by_state() == {"succeeded": 1}


async def test_get_of_an_unknown_job_returns_none(store: Store) -> None:
    assert await store.get(424242) is None


async def test_events_come_oldest_first_and_only_for_that_job(store: Store) -> None:
    a, b = await store.enqueue([new_job(queue="qa"), new_job(queue="qb")])
    ra = await claim_one(store, "w1", queue="qa")
    rb = await claim_one(store, "w1", queue="qb")
    await store.finish("w1", [outcome(ra, JobState.RETRYING)])
    ra2 = await claim_one(store, "w1", queue="qa")
    await store.finish("w1", [outcome(rb, JobState.FAILED), outcome(ra2, JobState.SUCCEEDED)])
    events = await store.events(a.id)
    assert [e.job_id for e in events] == [a.id] * 5
    assert [(e.from_state, e.to_state) for e in events] == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "retrying"),
        ("retrying", "running"),
        ("running", "succeeded"),
    ]
    stored = [e.id for e in events if e.id is not None]  # the others are read off the row
    assert stored == sorted(stored)
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert [e.to_state for e in await store.events(b.id)] == ["queued", "running", "failed"]
    assert await store.events(424242) == []


async def test_queue_backlog_counts_waiting_due_and_running_jobs_per_queue(store: Store) -> None:
    await seed(store)  # q0: 1 running, 5 queued; q1: 1 succeeded, 1 cancelled, 4 queued
    await store.enqueue([new_job("t0", "q1", delay=3600.0)])  # waiting, not due
    [failing] = await store.enqueue([new_job("t9", "q3")])
    running = await claim_one(store, "w3", queue="q3", task="t9")
    # Retrying in an hour: waiting, not due.
    await store.finish("w3", [outcome(running, JobState.RETRYING, delay=3600.0)])
    await store.set_queue_paused("q2", True, "maintenance")  # no jobs, still listed
    assert failing.id == running.id
    got = {b.name: (b.paused, b.waiting, b.due, b.running) for b in await store.queue_backlog()}
    assert got == {
        "q0": (False, 5, 5, 1),
        "q1": (False, 5, 4, 0),
        "q2": (True, 0, 0, 0),
        "q3": (False, 1, 0, 0),
    }
