"""Every interleaving of two operations' write transactions, on SQLite.

Each pair runs in every order its transactions can commit in (``interleavings.py``),
each on a fresh copy of a migrated database. In each run no acknowledged job may be
lost, nothing half-written may remain, and the end state must be that of one of the two
serial orders, or, when an operation was refused with an error, that of the other
operation alone.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tether.store.sqlite as sqlite_store
from tether.cancellation import CancellationService
from tether.job import Beat, Job, Outcome
from tether.states import JobState
from tether.store import create_store
from tether.store.sqlite import SqliteStore

from .interleavings import Pair, Run, Scheduler, jobs_state
from .support import SQLITE_NOW, new_job

BULK = 4  # jobs of the bulk enqueue: two chunks of two


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated database that every run starts from a copy of."""
    path = tmp_path_factory.mktemp("interleavings") / "template.db"

    async def migrate() -> None:
        store = create_store(f"sqlite:///{path}")
        await store.migrate()
        await store.close()

    asyncio.run(migrate())
    return path


@pytest.fixture
def scheduler(template: Path, tmp_path: Path) -> Scheduler:
    return Scheduler(template, tmp_path)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Bulk enqueues of a few jobs go in chunks of two, without pauses."""
    monkeypatch.setattr(sqlite_store, "BULK_CHUNK", 2)
    monkeypatch.setattr(sqlite_store, "BULK_PAUSE", 0.0)
    yield


def _acknowledged(run: Run) -> list[int]:
    ids: list[int] = []
    for out in run.outcomes:
        if isinstance(out, list):
            ids += [j.id for j in out if isinstance(j, Job)]
        elif isinstance(out, Job):
            ids.append(out.id)
    return ids


def _brief(outcomes: list[Any]) -> list[Any]:
    """Answers as ids and error names, short enough to read in a failure."""
    return [
        type(o).__name__
        if isinstance(o, BaseException)
        else [j.id if isinstance(j, Job) else j for j in o]
        if isinstance(o, list)
        else o
        for o in outcomes
    ]


async def _every_run_is_serial(
    scheduler: Scheduler, pair: Pair, check: Callable[[Run], None] | None = None
) -> list[Run]:
    serial = await scheduler.serial_states(pair)
    runs = await scheduler.every_interleaving(pair)
    for run in runs:
        where = f"steps {run.order}, answers {_brief(run.outcomes)}"
        jobs, _, open_batches, *_ = run.state
        present = {row[0]: row for row in jobs}
        for job_id in _acknowledged(run):
            assert job_id in present, f"acknowledged job {job_id} lost: {where}"
            assert not present[job_id][7], f"acknowledged job {job_id} still unclaimable: {where}"
        assert open_batches == 0, f"a batch left open: {where}"
        allowed = serial[:2]
        for i in (0, 1):
            if run.raised(i):
                allowed = [*allowed, serial[2 + (1 - i)]]  # refused: the other one alone
        assert run.state in allowed, f"end state of no serial order: {where}: {run.state}"
        if check is not None:
            check(run)
    return runs


# -- bulk enqueue against the discard of abandoned batches ---------------------------------


def _stall_after_first_chunk(step: int, conn: sqlite3.Connection) -> None:
    # Step 3 is the producer's second chunk (after opening its batch and the first
    # chunk): it stalled there for longer than a batch may, as a paused process does.
    if step == 3:
        conn.execute(
            "UPDATE tether_open_batches SET touched_at = touched_at - ?",
            (sqlite_store.BULK_ABANDONED_AFTER * 2,),
        )


async def _nothing(store: SqliteStore) -> None:
    return None


async def _bulk(store: SqliteStore, ctx: Any) -> list[Job]:
    return await store.enqueue([new_job(queue="bulk", args={"i": i}) for i in range(BULK)])


async def _rescue(store: SqliteStore, ctx: Any) -> list[Job]:
    await store.rescue()
    return []  # what it rescued is in the end state


def _all_or_nothing(run: Run) -> None:
    jobs, _, _ = run.state
    if run.raised(0):
        assert jobs == (), f"a refused bulk left jobs: {run.order}"
    else:
        assert len(run.outcomes[0]) == BULK and len(jobs) == BULK, run.order


@pytest.mark.usefixtures("small_chunks")
async def test_a_stalled_bulk_enqueue_and_its_discard_never_lose_an_acknowledged_job(
    scheduler: Scheduler,
) -> None:
    pair = Pair(_nothing, (_bulk, _rescue), jobs_state, (_stall_after_first_chunk, None))
    runs = await _every_run_is_serial(scheduler, pair, _all_or_nothing)
    # The race is reached: some producer was refused because its batch was discarded.
    assert any(r.raised(0) for r in runs)
    # And a rescue that saw the batch stale (its look came after the stall) but tried
    # its discard only after the producer's next chunk, before its close, left the live
    # producer alone.
    resumed = [r for r in runs if r.order[:5] == [0, 0, 1, 0, 1]]
    assert resumed and not any(r.raised(0) for r in resumed)


async def _claim(store: SqliteStore, ctx: Any) -> list[int]:
    return [j.id for j in await store.claim("w1", ["bulk"], ["t"], BULK, 60.0)]


@pytest.mark.usefixtures("small_chunks")
async def test_a_claim_never_takes_a_job_of_a_bulk_still_being_written(
    scheduler: Scheduler,
) -> None:
    def whole_or_none(run: Run) -> None:
        jobs, _, _ = run.state
        # Claimed only once the bulk closed, and then all of it at once.
        assert run.outcomes[1] in ([], [j[0] for j in jobs]), (run.order, run.outcomes)

    runs = await _every_run_is_serial(scheduler, Pair(_nothing, (_bulk, _claim), jobs_state))
    for run in runs:
        whole_or_none(run)


async def _abandoned_bulk(store: SqliteStore) -> None:
    """What a producer that died after its first chunk leaves: an open batch, stale,
    with a chunk of jobs in it."""
    await store.enqueue([new_job(queue="bulk", args={"i": i}) for i in range(2)])
    await store._write_async(
        lambda conn: (
            conn.execute("INSERT INTO tether_open_batches (id, touched_at) VALUES ('dead', 1)"),
            conn.execute("UPDATE tether_jobs SET batch = 'dead'"),
        )
    )


@pytest.mark.usefixtures("small_chunks")
async def test_two_rescuers_discarding_one_abandoned_bulk_leave_nothing(
    scheduler: Scheduler,
) -> None:
    # Two leaders overlapping through a handover both find the dead producer's batch.
    def nothing_left(run: Run) -> None:
        assert run.state == ((), (), 0), run.order

    await _every_run_is_serial(
        scheduler, Pair(_abandoned_bulk, (_rescue, _rescue), jobs_state), nothing_left
    )


# -- a cancel request against the attempt's end -------------------------------------------


async def _running(store: SqliteStore) -> Job:
    [job] = await store.enqueue([new_job(queue="q")])
    [claimed] = await store.claim("w1", ["q"], ["t"], 1, 60.0)
    assert claimed.id == job.id
    return claimed


async def _cancel(store: SqliteStore, job: Job) -> Job:
    return await store.request_cancel(job.id, "stop", False, "alice", False)


async def _succeed(store: SqliteStore, job: Job) -> set[int]:
    out = Outcome(job.id, job.lease_token, JobState.SUCCEEDED, result_json="1")
    return await store.finish("w1", [out])


async def test_a_cancel_request_and_the_attempts_end_commit_in_either_order(
    scheduler: Scheduler,
) -> None:
    def settled(run: Run) -> None:
        jobs, _, _ = run.state
        assert run.outcomes[1] == {jobs[0][0]}, run.order  # the finish is never refused
        assert jobs[0][2] == "succeeded"

    await _every_run_is_serial(scheduler, Pair(_running, (_cancel, _succeed), jobs_state), settled)


# -- two settlers of one cancellation record ----------------------------------------------


def _with_records(conn: sqlite3.Connection) -> tuple[Any, ...]:
    records = conn.execute(
        "SELECT job_id, status, json_array_length(steps), completed_at IS NOT NULL "
        "FROM tether_cancellations ORDER BY job_id"
    ).fetchall()
    return (*jobs_state(conn), tuple(records))


async def _partial_record(store: SqliteStore) -> Job:
    """A cancel that stopped waiting while the job ran (``partial``), then the job
    ended cancelled: the record waits for a follow-up to complete it."""
    job = await _running(store)
    result = await CancellationService(store, 0.01).cancel(
        job.id, reason="stop", force=False, cascade=False, wait=0, actor="alice", request_id=None
    )
    assert result.status == "partial", result
    out = Outcome(job.id, job.lease_token, JobState.CANCELLED, reason="stop")
    assert await store.finish("w1", [out]) == {job.id}
    return job


async def _follow_up(store: SqliteStore, job: Job) -> list[str]:
    return await CancellationService(store, 0.01).follow_up()


async def test_two_follow_ups_complete_one_cancellation_record_once(
    scheduler: Scheduler,
) -> None:
    def once(run: Run) -> None:
        *_, records = run.state
        assert [r[1] for r in records] == ["completed"], run.order
        assert sorted(len(o) for o in run.outcomes) == [0, 1], (run.order, run.outcomes)

    await _every_run_is_serial(
        scheduler, Pair(_partial_record, (_follow_up, _follow_up), _with_records), once
    )


# -- one idempotency key, two enqueues ----------------------------------------------------


async def _keyed(store: SqliteStore, ctx: Any) -> list[Job]:
    return await store.enqueue([new_job(queue="q", idempotency_key="order-7")])


async def test_two_enqueues_with_one_idempotency_key_give_one_job(scheduler: Scheduler) -> None:
    def one_job(run: Run) -> None:
        jobs, _, _ = run.state
        assert len(jobs) == 1
        assert [j.id for j in run.outcomes[0]] == [j.id for j in run.outcomes[1]] == [jobs[0][0]]

    await _every_run_is_serial(scheduler, Pair(_nothing, (_keyed, _keyed), jobs_state), one_job)


# -- the rescue of an expired lease against its heartbeat ---------------------------------


async def _expired(store: SqliteStore) -> Job:
    job = await _running(store)
    await store._write_async(
        lambda conn: conn.execute(
            f"UPDATE tether_jobs SET lease_expires_at = {SQLITE_NOW} - 1 WHERE id = ?", (job.id,)
        )
    )
    return job


async def _rescue_expired(store: SqliteStore, ctx: Any) -> list[int]:
    return [j.id for j in await store.rescue()]


async def _beat(store: SqliteStore, job: Job) -> list[int]:
    result = await store.heartbeat("w1", [Beat(job.id, job.lease_token)], 60.0)
    return sorted(result.alive)


async def test_a_rescue_and_a_late_heartbeat_never_leave_two_attempts(
    scheduler: Scheduler,
) -> None:
    def one_attempt(run: Run) -> None:
        jobs, _, _ = run.state
        rescued, alive = run.outcomes
        # Exactly one side wins: the heartbeat kept the lease, or the rescue took it.
        assert bool(rescued) != bool(alive), (run.order, run.outcomes)
        assert jobs[0][2] == ("running" if alive else "retrying")

    await _every_run_is_serial(
        scheduler, Pair(_expired, (_rescue_expired, _beat), jobs_state), one_attempt
    )
