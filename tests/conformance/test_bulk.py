"""A bulk enqueue is all or nothing, however large (SQLite commits it in chunks)."""

from __future__ import annotations

import pytest

from tether.errors import InvalidJobError
from tether.states import JobState
from tether.store import Store

from .support import Db, claim_one, fresh_queue, new_job

MANY = 2500  # more than one chunk of a SQLite bulk enqueue


async def test_a_bulk_enqueue_that_fails_half_way_leaves_nothing(store: Store, db: Db) -> None:
    queue = fresh_queue()
    jobs = [new_job(queue=queue, args={"i": i}) for i in range(MANY)]
    # The last job, in the last chunk, depends on a job that does not exist.
    jobs.append(new_job(queue=queue, depends_on=(10**9,)))
    with pytest.raises(InvalidJobError, match="unknown dependency"):
        await store.enqueue(jobs)
    assert await store.count_by_state() == {}
    assert db.execute("SELECT COUNT(*) FROM tether_job_events") == [(0,)]
    assert await store.claim("w1", [queue], ["t"], 10, 60) == []


async def test_a_large_bulk_enqueue_keeps_order_and_dependencies_across_chunks(
    store: Store,
) -> None:
    queue = fresh_queue()
    jobs = [new_job(queue=queue, args={"i": i}) for i in range(MANY)]
    jobs.append(new_job(queue=queue, args={"last": True}, depends_on_batch=(0, MANY - 1)))
    out = await store.enqueue(jobs)
    assert [j.args for j in out[:MANY]] == [{"i": i} for i in range(MANY)]
    assert [j.id for j in out] == sorted(j.id for j in out)
    assert out[-1].state is JobState.BLOCKED
    upstream, _ = await store.dependencies(out[-1].id)
    assert set(upstream) == {out[0].id, out[MANY - 1].id}
    assert (await claim_one(store, queue=queue)).id == out[0].id
