"""Releases that concurrent transactions cannot both miss (PostgreSQL, behind a barrier).

Each test holds two transactions at commit (:func:`.concurrency.commit_together`): both
have run their statements, neither has committed. Deciding a release from a snapshot
there is a write skew: each transaction sees the other's job still running, and the
parent (or the dependent) would stay blocked for good.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tether.job import Beat, Job
from tether.states import JobState
from tether.store import Store, caller_store, create_store

from .concurrency import commit_together, stuck_jobs
from .support import Db, fresh_queue, new_job, outcome, running_job

pytestmark = pytest.mark.postgres

ROUNDS = 5  # workflows per test: each is an independent chance to lose the release


@pytest.fixture
async def pg_store(pg_url: str) -> Any:
    s = create_store(pg_url)
    await s.open()
    yield s
    await s.close()


@pytest.fixture
def pg_db(pg_url: str) -> Any:
    conn = Db(pg_url)
    yield conn
    conn.close()


async def _waiting_parent(store: Store, children: int) -> tuple[Job, list[Job]]:
    """A parent blocked waiting for ``children`` running children."""
    parent = await running_job(store, "wp", task="parent")
    queue = fresh_queue()
    for _ in range(children):
        assert await store.spawn(parent.id, parent.lease_token, new_job("child", queue))
    assert await store.finish("wp", [outcome(parent, JobState.BLOCKED, phase="fanin")])
    kids = await store.claim("wc", [queue], ["child"], children, 60.0)
    assert len(kids) == children
    return parent, kids


async def _blocked(store: Store, ids: list[int]) -> list[int]:
    """Those of ``ids`` still blocked (each should have been released)."""
    jobs = [await store.get(i) for i in ids]
    return [j.id for j in jobs if j is not None and j.state is JobState.BLOCKED]


def _finish(job: Job, state: JobState = JobState.SUCCEEDED) -> Any:
    async def op(s: Store) -> set[int]:
        return await s.finish(f"w{job.id}", [outcome(job, state)])

    return op


async def test_two_sibling_completions_committed_together_release_their_parent(
    pg_url: str, pg_store: Store, pg_db: Db
) -> None:
    parents = []
    for _ in range(ROUNDS):
        parent, kids = await _waiting_parent(pg_store, 2)
        results = await commit_together(pg_url, [_finish(k) for k in kids])
        assert results == [{kids[0].id}, {kids[1].id}]
        parents.append(parent.id)
    assert await _blocked(pg_store, parents) == []
    assert stuck_jobs(pg_db) == []


async def test_a_child_ending_as_its_parent_starts_waiting_releases_the_parent(
    pg_url: str, pg_store: Store, pg_db: Db
) -> None:
    parents = []
    for _ in range(ROUNDS):
        parent = await running_job(pg_store, "wp", task="parent")
        queue = fresh_queue()
        assert await pg_store.spawn(parent.id, parent.lease_token, new_job("child", queue))
        [kid] = await pg_store.claim("wc", [queue], ["child"], 1, 60.0)
        wait = _finish(parent, JobState.BLOCKED)
        results = await commit_together(pg_url, [wait, _finish(kid)])
        assert results == [{parent.id}, {kid.id}]
        parents.append(parent.id)
    assert await _blocked(pg_store, parents) == []
    assert stuck_jobs(pg_db) == []


async def test_two_upstreams_succeeding_together_release_their_dependent(
    pg_url: str, pg_store: Store, pg_db: Db
) -> None:
    deps = []
    for _ in range(ROUNDS):
        a = await running_job(pg_store, "wa")
        b = await running_job(pg_store, "wb")
        [dep] = await pg_store.enqueue([new_job(depends_on=(a.id, b.id))])
        assert dep.state is JobState.BLOCKED
        assert await commit_together(pg_url, [_finish(a), _finish(b)]) == [{a.id}, {b.id}]
        deps.append(dep.id)
    assert await _blocked(pg_store, deps) == []
    assert stuck_jobs(pg_db) == []


# -- a transactional enqueue with depends_on (issue 22, defect 1) ----------------------


async def _never_waits(url: str, op: Any) -> Any:
    """Run ``op`` on its own connection and transaction; fail if it waits on a lock
    (it would wait for the caller's commit, however long that takes)."""
    [result] = await commit_together(url, [op], refuse_lock_waits=True)
    return result


@pytest.fixture
async def caller(pg_url: str) -> Any:
    conn = await psycopg.AsyncConnection.connect(pg_url)
    yield conn
    await conn.close()


async def test_an_open_transactional_enqueue_does_not_hold_its_upstreams_worker(
    pg_url: str, pg_store: Store, caller: psycopg.AsyncConnection[Any]
) -> None:
    upstream = await running_job(pg_store, "wa")
    [dep] = await caller_store(pg_url, caller).enqueue([new_job(depends_on=(upstream.id,))])
    # The caller's transaction stays open: the upstream's worker beats and finishes.
    beat = await _never_waits(pg_url, lambda s: s.heartbeat("wa", [_beat(upstream)], 60.0))
    assert beat.alive == {upstream.id}
    assert await _never_waits(pg_url, _finish(upstream)) == {upstream.id}
    await caller.commit()
    # The upstream ended before the dependency was committed: the commit released it.
    assert (await pg_store.get(dep.id)).state is JobState.QUEUED  # type: ignore[union-attr]


async def test_an_open_transactional_enqueue_does_not_hold_back_its_queued_upstream(
    pg_url: str, pg_store: Store, caller: psycopg.AsyncConnection[Any]
) -> None:
    queue = fresh_queue()
    [upstream] = await pg_store.enqueue([new_job(queue=queue)])
    [dep] = await caller_store(pg_url, caller).enqueue([new_job(depends_on=(upstream.id,))])
    # A claim locked its candidates FOR UPDATE SKIP LOCKED, and so skipped the job.
    [claimed] = await pg_store.claim("wa", [queue], ["t"], 1, 60.0)
    assert claimed.id == upstream.id
    assert await _never_waits(pg_url, _finish(claimed)) == {upstream.id}
    await caller.commit()
    assert (await pg_store.get(dep.id)).state is JobState.QUEUED  # type: ignore[union-attr]


async def test_an_upstream_failing_before_the_enqueue_commits_cancels_the_dependent(
    pg_url: str, pg_store: Store, caller: psycopg.AsyncConnection[Any]
) -> None:
    upstream = await running_job(pg_store, "wa")
    [dep] = await caller_store(pg_url, caller).enqueue([new_job(depends_on=(upstream.id,))])
    assert await _never_waits(pg_url, _finish(upstream, JobState.FAILED)) == {upstream.id}
    await caller.commit()
    assert (await pg_store.get(dep.id)).state is JobState.CANCELLED  # type: ignore[union-attr]


async def test_an_enqueue_and_its_upstreams_end_committed_together_leave_nothing_blocked(
    pg_url: str, pg_store: Store, pg_db: Db
) -> None:
    deps = []
    for _ in range(ROUNDS):
        upstream = await running_job(pg_store, "wa")

        async def enqueue(s: Store, up: int = upstream.id) -> list[Job]:
            return await s.enqueue([new_job(depends_on=(up,))])

        made, finished = await commit_together(pg_url, [enqueue, _finish(upstream)])
        assert finished == {upstream.id}
        deps.append(made[0].id)
    assert await _blocked(pg_store, deps) == []
    assert stuck_jobs(pg_db) == []


def _beat(job: Job) -> Beat:
    return Beat(job_id=job.id, lease_token=job.lease_token)
