"""An absolute run_at beside delay, and a uniqueness window for idempotency keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from tether import App, InvalidJobError, JobContext
from tether.store import Store

from .support import SLACK, Db, enqueue_one, new_job


async def test_run_at_sets_the_absolute_start_time(store: Store, db: Db) -> None:
    later = db.now() + timedelta(hours=2)
    job = await enqueue_one(store, run_at=later)
    assert abs(job.run_at - later) <= SLACK
    assert await store.claim("w1", ["default"], ["t"], 10, 60.0) == []
    # An instant in the past (another time zone, too) is due at once.
    past = (db.now() - timedelta(minutes=5)).astimezone(timezone(timedelta(hours=-7)))
    due = await enqueue_one(store, run_at=past)
    assert abs(due.run_at - past) <= SLACK
    assert [j.id for j in await store.claim("w1", ["default"], ["t"], 10, 60.0)] == [due.id]


async def test_a_key_past_its_window_enqueues_a_new_job(store: Store, db: Db) -> None:
    first = await enqueue_one(store, idempotency_key="report-1", unique_for=3600.0)
    again = await enqueue_one(store, idempotency_key="report-1", unique_for=3600.0)
    assert again.id == first.id  # inside the window: the same job
    db.execute(
        "UPDATE tether_jobs SET idempotency_expires_at = created_at WHERE id = %s", (first.id,)
    )
    [fresh, same] = await store.enqueue(
        [
            new_job(idempotency_key="report-1", unique_for=3600.0),
            new_job(idempotency_key="report-1", unique_for=3600.0),
        ]
    )
    assert fresh.id != first.id and same.id == fresh.id
    assert fresh.idempotency_key == "report-1"
    old = await store.get(first.id)
    assert old is not None and old.idempotency_key is None  # the old job let the key go


async def test_a_key_without_a_window_returns_the_old_job_for_ever(store: Store, db: Db) -> None:
    first = await enqueue_one(store, idempotency_key="once")
    db.set_ago("tether_jobs", "created_at", first.id, 10 * 365 * 86400)
    again = await enqueue_one(store, idempotency_key="once", unique_for=1.0)
    assert again.id == first.id  # the window is the old job's, and it has none


async def test_dependent_batches_honour_the_window_too(store: Store, db: Db) -> None:
    base = await enqueue_one(store)
    first = await enqueue_one(store, idempotency_key="k", unique_for=60.0, depends_on=(base.id,))
    db.execute(
        "UPDATE tether_jobs SET idempotency_expires_at = created_at WHERE id = %s", (first.id,)
    )
    fresh = await enqueue_one(store, idempotency_key="k", unique_for=60.0, depends_on=(base.id,))
    assert fresh.id != first.id


async def test_app_refuses_unclear_schedules(app: App) -> None:
    @app.task(name="t")
    async def t(ctx: JobContext) -> None:
        pass

    when = datetime.now(UTC) + timedelta(hours=1)
    with pytest.raises(InvalidJobError, match="timezone-aware"):
        await t.options(run_at=when.replace(tzinfo=None)).enqueue()
    with pytest.raises(InvalidJobError, match="not both"):
        await t.options(run_at=when, delay=5).enqueue()
    with pytest.raises(InvalidJobError, match="needs an idempotency_key"):
        await t.options(unique_for=60).enqueue()
    with pytest.raises(InvalidJobError, match="positive"):
        await t.options(idempotency_key="k", unique_for=0).enqueue()
    assert await app.jobs.list() == []
    job = await t.options(run_at=when, idempotency_key="k", unique_for=60).enqueue()
    assert abs(job.run_at - when) <= SLACK
