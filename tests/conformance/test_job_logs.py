"""A job's own log (:class:`~tether.store.protocols.JobLogStore`): lines written in
batches under the job's lease, read back in order after a seq, bounded per job (the
first lines kept, the rest counted), and removed with the job."""

from __future__ import annotations

import pytest

from tether.config import DAY, RetentionConfig
from tether.joblog import DROPPED, LogBatch, LogsWritten, PendingLine
from tether.maintenance import Pruner
from tether.states import JobState
from tether.store import Store

from .support import Db, claim_one, outcome, running_job

BOUNDS = {"max_lines": 100, "max_bytes": 10_000}


def lines(*messages: str, level: str = "info", at: float = 1_700_000_000.0) -> list[PendingLine]:
    return [PendingLine(at + i, level, m) for i, m in enumerate(messages)]


def count(db: Db, job_id: int) -> int:
    rows = db.execute("SELECT COUNT(*) FROM tether_job_logs WHERE job_id = %s", (job_id,))
    return int(rows[0][0])


async def test_lines_are_read_back_in_order_after_a_seq(store: Store) -> None:
    job = await running_job(store)
    assert await store.append_logs(job.id, job.lease_token, lines("a", "b"), **BOUNDS)
    assert await store.append_logs(job.id, job.lease_token, lines("c", level="warning"), **BOUNDS)
    read = await store.logs(job.id)
    assert [(x.seq, x.level, x.message) for x in read] == [
        (1, "info", "a"),
        (2, "info", "b"),
        (3, "warning", "c"),
    ]
    assert all(x.job_id == job.id and x.attempt == job.attempt for x in read)
    assert read[0].at.timestamp() == 1_700_000_000.0  # the worker's clock, as given
    assert [x.message for x in await store.logs(job.id, after=1)] == ["b", "c"]
    assert [x.message for x in await store.logs(job.id, after=1, limit=1)] == ["b"]
    assert await store.logs(job.id, after=3) == []
    assert await store.logs(job.id + 1000) == []


async def test_each_job_has_its_own_lines(store: Store) -> None:
    one = await running_job(store)
    two = await running_job(store)
    assert await store.append_logs(one.id, one.lease_token, lines("one"), **BOUNDS)
    assert await store.append_logs(two.id, two.lease_token, lines("two"), **BOUNDS)
    assert [(x.seq, x.message) for x in await store.logs(one.id)] == [(1, "one")]
    assert [(x.seq, x.message) for x in await store.logs(two.id)] == [(1, "two")]


async def test_lines_past_the_line_bound_are_counted_not_kept(store: Store) -> None:
    job = await running_job(store)
    bounds = {"max_lines": 3, "max_bytes": 10_000}
    assert await store.append_logs(job.id, job.lease_token, lines("1", "2"), **bounds)
    assert await store.append_logs(job.id, job.lease_token, lines("3", "4", "5"), **bounds)
    assert await store.append_logs(job.id, job.lease_token, lines("6"), **bounds)
    read = await store.logs(job.id)
    assert [x.message for x in read[:3]] == ["1", "2", "3"]
    [marker] = read[3:]
    assert (marker.seq, marker.level, marker.dropped) == (4, DROPPED, 3)
    assert "3 more line(s) dropped" in marker.message


async def test_lines_past_the_byte_bound_are_counted_not_kept(store: Store) -> None:
    job = await running_job(store)
    bounds = {"max_lines": 100, "max_bytes": 10}
    # "é" is two bytes: the bound counts UTF-8 bytes, not characters.
    written = lines("ééé", "abcd", "x", "y")
    assert await store.append_logs(job.id, job.lease_token, written, **bounds)
    read = await store.logs(job.id)
    # 6 + 4 bytes fill it; "x" would pass it. The first lines are kept, in order: a
    # later short line does not jump a dropped one.
    assert [x.message for x in read[:2]] == ["ééé", "abcd"]
    assert (read[2].level, read[2].dropped) == (DROPPED, 2)
    assert len(read) == 3


async def test_a_stale_token_writes_nothing(store: Store, db: Db) -> None:
    job = await running_job(store, lease=60)
    db.expire_lease(job.id)
    [rescued] = await store.rescue()
    assert rescued.lease_token == job.lease_token + 1
    assert await store.append_logs(job.id, job.lease_token, lines("zombie"), **BOUNDS) is False
    db.make_due(job.id)
    again = await claim_one(store, queue=job.queue, task=job.task)
    assert again.id == job.id
    assert await store.append_logs(job.id, job.lease_token, lines("zombie"), **BOUNDS) is False
    assert await store.append_logs(again.id, again.lease_token, lines("new"), **BOUNDS)
    [line] = await store.logs(job.id)
    assert (line.message, line.attempt) == ("new", again.attempt)


async def test_a_finished_job_takes_no_more_lines(store: Store) -> None:
    job = await running_job(store)
    assert await store.append_logs(job.id, job.lease_token, lines("before"), **BOUNDS)
    assert await store.finish("w1", [outcome(job, JobState.SUCCEEDED)]) == {job.id}
    assert await store.append_logs(job.id, job.lease_token, lines("after"), **BOUNDS) is False
    assert [x.message for x in await store.logs(job.id)] == ["before"]


async def test_deleting_a_job_removes_its_lines(store: Store, db: Db) -> None:
    job = await running_job(store)
    keep = await running_job(store)
    for j in (job, keep):
        assert await store.append_logs(j.id, j.lease_token, lines("x", "y"), **BOUNDS)
    await store.delete(job.id, "alice")
    assert count(db, job.id) == 0
    assert count(db, keep.id) == 2


async def test_pruning_a_job_removes_its_lines(store: Store, db: Db) -> None:
    old = await running_job(store)
    young = await running_job(store)
    for job in (old, young):
        assert await store.append_logs(job.id, job.lease_token, lines("x", "y"), **BOUNDS)
        assert await store.finish("w1", [outcome(job, JobState.SUCCEEDED)]) == {job.id}
    db.set_ago("tether_jobs", "finished_at", old.id, 2 * DAY)
    report = await Pruner(store, RetentionConfig(batch_pause=0)).prune()
    assert report.counts["jobs"] == 1 and report.counts["logs"] == 2
    assert count(db, old.id) == 0
    assert count(db, young.id) == 2


async def test_lines_the_writer_dropped_are_counted_with_the_rest(store: Store) -> None:
    job = await running_job(store)
    bounds = {"max_lines": 2, "max_bytes": 10_000}
    assert await store.append_logs(job.id, job.lease_token, lines("1", "2", "3"), **bounds)
    assert await store.append_logs(job.id, job.lease_token, [], dropped=4, **bounds)
    read = await store.logs(job.id)
    assert [x.message for x in read[:2]] == ["1", "2"]
    assert (read[2].seq, read[2].dropped) == (3, 5)


async def test_one_write_takes_several_jobs_and_refuses_the_stale_ones(
    store: Store, db: Db
) -> None:
    one = await running_job(store)
    two = await running_job(store)
    gone = await running_job(store, lease=60)
    db.expire_lease(gone.id)
    [rescued] = await store.rescue()
    assert rescued.id == gone.id
    assert await store.append_logs(two.id, two.lease_token, lines("earlier"), **BOUNDS)
    batches = [
        LogBatch(one.id, one.lease_token, lines("a", "b")),
        LogBatch(two.id, two.lease_token, lines("c")),
        LogBatch(gone.id, gone.lease_token, lines("zombie")),
    ]
    done = await store.append_log_batches(batches, max_lines=2, max_bytes=10_000)
    assert (done.taken, done.busy) == ({one.id, two.id}, set())
    assert [x.message for x in await store.logs(one.id)] == ["a", "b"]
    [earlier, c] = await store.logs(two.id)
    assert (earlier.seq, earlier.message, c.seq, c.message) == (1, "earlier", 2, "c")
    assert await store.logs(gone.id) == []
    assert await store.append_log_batches([], max_lines=2, max_bytes=10) == LogsWritten()


@pytest.mark.postgres
async def test_a_row_held_elsewhere_is_skipped_as_busy_not_lost(pg_url: str) -> None:
    # Nothing waits for a job's row: a job whose row someone holds (a delete under way,
    # an operator) is reported busy, its lines unwritten, and the others go through.
    import psycopg

    from tether.store import create_store

    store = create_store(pg_url)
    await store.open()
    try:
        held = await running_job(store)
        free = await running_job(store)
        batches = [
            LogBatch(held.id, held.lease_token, lines("held")),
            LogBatch(free.id, free.lease_token, lines("free")),
        ]
        with psycopg.connect(pg_url) as holder:
            holder.execute("SELECT 1 FROM tether_jobs WHERE id = %s FOR UPDATE", (held.id,))
            done = await store.append_log_batches(batches, **BOUNDS)
            assert (done.taken, done.busy) == ({free.id}, {held.id})
            holder.rollback()
        assert await store.logs(held.id) == []
        done = await store.append_log_batches(batches[:1], **BOUNDS)
        assert done.taken == {held.id}
        assert [x.message for x in await store.logs(held.id)] == ["held"]
    finally:
        await store.close()
