"""SQLite: a bulk enqueue never holds the write lock for long. It commits in chunks,
a heartbeat gets through between them, and its jobs are claimable only once it has
committed in full (a failed, cancelled or abandoned bulk leaves nothing)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator

import pytest

from tests.conformance.support import new_job
from tests.helpers import eventually
from tether.errors import InvalidJobError, StoreError
from tether.job import Beat, Job
from tether.store import Store, create_store
from tether.store.sqlite import BULK_CHUNK

CHUNKS = 6


@pytest.fixture
async def sqlite_store(sqlite_url: str) -> AsyncIterator[Store]:
    store = create_store(sqlite_url)
    await store.open()
    await store.migrate()
    yield store
    await store.close()


def _path(url: str) -> str:
    return url.removeprefix("sqlite:///")


async def _some_committed(store: Store) -> None:
    """Until part of a bulk has committed (each read runs between two writes)."""

    async def queued() -> int:
        return (await store.count_by_state()).get("queued", 0)

    await eventually(queued, timeout=60, every=0.005)


def _bulk(store: Store) -> asyncio.Task[list[Job]]:
    return asyncio.ensure_future(
        store.enqueue([new_job(queue="bulk") for _ in range(CHUNKS * BULK_CHUNK)])
    )


async def _running(store: Store) -> Job:
    [job] = await store.enqueue([new_job(queue="live")])
    [claimed] = await store.claim("w1", ["live"], ["t"], 1, 3.0)
    assert claimed.id == job.id
    return claimed


async def test_a_heartbeat_gets_through_while_a_big_bulk_enqueue_is_in_progress(
    sqlite_store: Store,
) -> None:
    store = sqlite_store
    live = await _running(store)
    bulk = _bulk(store)
    await _some_committed(store)
    beat = await store.heartbeat("w1", [Beat(live.id, live.lease_token)], 3.0)
    # It came between two chunks, not after the whole bulk.
    assert not bulk.done(), "the heartbeat waited for the whole bulk enqueue"
    assert beat.alive == frozenset({live.id})
    # Meanwhile nothing of the bulk is claimable, though part of it has committed.
    assert await store.claim("w2", ["bulk"], ["t"], 10, 60) == []
    jobs = await bulk
    assert len(jobs) == CHUNKS * BULK_CHUNK
    claimed = await store.claim("w2", ["bulk"], ["t"], 10, 60)
    assert [j.id for j in claimed] == [j.id for j in jobs[:10]]


async def test_a_cancelled_bulk_enqueue_removes_what_it_committed(
    sqlite_store: Store, sqlite_url: str
) -> None:
    store = sqlite_store
    bulk = _bulk(store)
    await _some_committed(store)
    bulk.cancel()
    with pytest.raises(asyncio.CancelledError):
        await bulk
    assert await store.count_by_state() == {}
    with sqlite3.connect(_path(sqlite_url)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM tether_job_events").fetchone() == (0,)
        assert conn.execute("SELECT COUNT(*) FROM tether_open_batches").fetchone() == (0,)


async def test_the_rescue_deletes_the_jobs_of_a_bulk_whose_producer_died(
    sqlite_store: Store, sqlite_url: str
) -> None:
    store = sqlite_store
    kept = await store.enqueue([new_job(queue="bulk") for _ in range(3)])
    orphans = await store.enqueue([new_job(queue="bulk") for _ in range(5)])
    # What a producer killed between two chunks leaves: an open batch, long untouched.
    with sqlite3.connect(_path(sqlite_url)) as conn:
        conn.execute("INSERT INTO tether_open_batches (id, touched_at) VALUES ('bulk-dead', 0)")
        conn.executemany(
            "UPDATE tether_jobs SET batch = 'bulk-dead' WHERE id = ?", [(j.id,) for j in orphans]
        )
    assert await store.rescue() == []
    left = await store.claim("w1", ["bulk"], ["t"], 10, 60)
    assert sorted(j.id for j in left) == [j.id for j in kept]
    assert [await store.get(j.id) for j in orphans] == [None] * len(orphans)


async def _in_open_batch(store: Store, url: str, **fields: object) -> Job:
    """A job as another producer's bulk enqueue leaves it while still writing."""
    [job] = await store.enqueue([new_job(queue="bulk", **fields)])
    with sqlite3.connect(_path(url)) as conn:
        conn.execute("INSERT INTO tether_open_batches (id, touched_at) VALUES ('bulk-busy', 1e12)")
        conn.execute("UPDATE tether_jobs SET batch = 'bulk-busy' WHERE id = ?", (job.id,))
    return job


async def test_a_key_held_by_a_bulk_still_being_written_gets_no_answer_yet(
    sqlite_store: Store, sqlite_url: str
) -> None:
    # Answering with that job would hand out an id its bulk may yet delete.
    await _in_open_batch(sqlite_store, sqlite_url, idempotency_key="K")
    with pytest.raises(StoreError, match="still in progress"):
        await sqlite_store.enqueue([new_job(idempotency_key="K")])


async def test_a_job_of_a_bulk_still_being_written_is_no_dependency_yet(
    sqlite_store: Store, sqlite_url: str
) -> None:
    # A dependent accepted now would stay blocked for ever if that bulk failed.
    pending = await _in_open_batch(sqlite_store, sqlite_url)
    with pytest.raises(InvalidJobError, match=str(pending.id)):
        await sqlite_store.enqueue([new_job(depends_on=(pending.id,))])
