"""Retention: the pruner's store methods delete what outlived its retention, and only that.

Time is moved by backdating ``finished_at`` (and the audit and worker rows' times) in
the database, so no test waits for a retention to pass.
"""

from __future__ import annotations

from prometheus_client import REGISTRY

from tether.config import DAY, RetentionConfig
from tether.job import Job
from tether.maintenance import Pruner
from tether.states import JobState
from tether.store import Store

from .support import Db, enqueue_one, fresh_queue, new_job, outcome, running_job

RETENTION = RetentionConfig(batch_size=2, batch_pause=0)


async def finished(store: Store, state: JobState = JobState.SUCCEEDED, **fields: object) -> Job:
    """A job that ran and ended in ``state`` (with an artifact saved on the way)."""
    job = await running_job(store, **fields)
    assert await store.save_artifact(job.id, job.lease_token, "out.txt", b"data")
    error = None if state is JobState.SUCCEEDED else "boom"
    assert await store.finish("w1", [outcome(job, state, error=error)]) == {job.id}
    return job


def age(db: Db, job: Job, days: float) -> None:
    """Make ``job`` look finished ``days`` ago."""
    db.set_ago("tether_jobs", "finished_at", job.id, days * DAY)


def count(db: Db, table: str, column: str, job_id: int) -> int:
    return int(db.execute(f"SELECT COUNT(*) FROM {table} WHERE {column} = %s", (job_id,))[0][0])


async def prune(store: Store, **kwargs: object) -> dict[str, int]:
    report = await Pruner(store, RETENTION).prune(**kwargs)  # type: ignore[arg-type]
    return report.counts


async def test_jobs_older_than_their_state_retention_go_with_all_their_rows(
    store: Store, db: Db
) -> None:
    old_ok = await finished(store)
    await store.create_cancellation(
        "c-old",
        job_id=old_ok.id,
        request_id=None,
        reason="late",
        force=False,
        cascade=True,
        initiated_by=None,
    )
    new_ok = await finished(store)
    old_failed = await finished(store, JobState.FAILED, max_attempts=1)
    young_failed = await finished(store, JobState.FAILED, max_attempts=1)
    age(db, old_ok, 1.5)
    age(db, new_ok, 0.5)
    age(db, old_failed, 8)
    age(db, young_failed, 3)  # older than succeeded's retention, younger than failed's
    stored = sum(count(db, "tether_job_events", "job_id", j.id) for j in (old_ok, old_failed))
    counts = await prune(store)
    assert counts["jobs"] == 2
    assert counts["artifacts"] == 2 and counts["cancellations"] == 1
    assert counts["events"] == stored
    for gone in (old_ok, old_failed):
        assert await store.get(gone.id) is None
        assert count(db, "tether_job_events", "job_id", gone.id) == 0
        assert count(db, "tether_artifacts", "job_id", gone.id) == 0
        assert count(db, "tether_cancellations", "job_id", gone.id) == 0
    for kept in (new_ok, young_failed):
        assert await store.get(kept.id) is not None
        assert count(db, "tether_artifacts", "job_id", kept.id) == 1
    assert (await prune(store))["jobs"] == 0


async def test_active_jobs_are_never_pruned_however_old(store: Store, db: Db) -> None:
    queued = await enqueue_one(store, queue=fresh_queue())
    running = await running_job(store)
    for job in (queued, running):
        for column in ("created_at", "run_at"):
            db.set_ago("tether_jobs", column, job.id, 400 * DAY)
    counts = await prune(store, older_than=0.0)
    assert counts["jobs"] == 0
    assert db.state(queued.id) == "queued" and db.state(running.id) == "running"


async def complete(store: Store, job: Job) -> None:
    """Claim ``job`` (alone in its queue) and let it succeed."""
    [claimed] = await store.claim("w1", [job.queue], [job.task], 1, 60)
    assert claimed.id == job.id
    assert await store.finish("w1", [outcome(claimed, JobState.SUCCEEDED)]) == {job.id}


async def linked(store: Store, *upstream: Job) -> Job:
    [job] = await store.enqueue(
        [new_job(queue=fresh_queue(), depends_on=tuple(u.id for u in upstream))]
    )
    return job


async def test_a_workflow_with_an_active_member_is_kept_whole(store: Store, db: Db) -> None:
    # A chain d -> a -> b -> c: d and a succeeded long ago, b waits to run, c is blocked.
    d = await finished(store)
    a = await linked(store, d)
    await complete(store, a)
    b = await linked(store, a)
    c = await linked(store, b)
    assert (db.state(b.id), db.state(c.id)) == ("queued", "blocked")
    # A running parent whose child succeeded long ago.
    parent = await running_job(store)
    child = await store.spawn(parent.id, parent.lease_token, new_job(queue=fresh_queue()))
    assert child is not None
    await complete(store, child)
    lone = await finished(store)
    for job in (d, a, child, lone):
        age(db, job, 30)

    counts = await prune(store)
    assert counts["jobs"] == 1 and await store.get(lone.id) is None
    for job in (d, a, b, c, parent, child):
        assert await store.get(job.id) is not None
    assert await store.dependencies(a.id) == ([d.id], [b.id])

    # Once every member has finished, the workflows go whole.
    await complete(store, b)
    await complete(store, c)
    assert await store.finish("w1", [outcome(parent, JobState.SUCCEEDED)]) == {parent.id}
    for job in (b, c, parent):
        age(db, job, 30)
    counts = await prune(store)
    assert counts["jobs"] == 6 and counts["dependencies"] == 3
    for job in (d, a, b, c, parent, child):
        assert await store.get(job.id) is None


async def test_a_workflow_with_a_failed_member_within_its_retention_is_kept_whole(
    store: Store, db: Db
) -> None:
    # A parent whose fan-in failed, over a child that succeeded long ago: a person may
    # retry the parent, and its retry reads the child.
    parent = await running_job(store, max_attempts=1)
    child = await store.spawn(parent.id, parent.lease_token, new_job(queue=fresh_queue()))
    assert child is not None
    await complete(store, child)
    error = outcome(parent, JobState.FAILED, error="fan-in failed")
    assert await store.finish("w1", [error]) == {parent.id}
    # And a chain: d succeeded long ago, a (depending on d) failed.
    d = await finished(store)
    [a] = await store.enqueue([new_job(queue=fresh_queue(), depends_on=(d.id,), max_attempts=1)])
    [claimed] = await store.claim("w1", [a.queue], [a.task], 1, 60)
    assert await store.finish("w1", [outcome(claimed, JobState.FAILED, error="x")]) == {a.id}
    for job in (child, d):
        age(db, job, 30)
    for job in (parent, a):
        age(db, job, 3)  # failed three days ago: within failed's seven

    assert (await prune(store))["jobs"] == 0
    # An explicit age for succeeded jobs alone leaves failed ones their retention.
    assert (await prune(store, states=["succeeded"], older_than=0.0))["jobs"] == 0
    for job in (parent, child, a, d):
        assert await store.get(job.id) is not None

    # Once the failed members age out, their workflows go together.
    for job in (parent, a):
        age(db, job, 8)
    counts = await prune(store)
    assert counts["jobs"] == 4 and counts["dependencies"] == 1
    for job in (parent, child, a, d):
        assert await store.get(job.id) is None


async def test_failed_jobs_kept_forever_keep_their_workflows(store: Store, db: Db) -> None:
    parent = await running_job(store, max_attempts=1)
    child = await store.spawn(parent.id, parent.lease_token, new_job(queue=fresh_queue()))
    assert child is not None
    await complete(store, child)
    assert await store.finish("w1", [outcome(parent, JobState.FAILED, error="x")]) == {parent.id}
    age(db, child, 400)
    age(db, parent, 400)
    report = await Pruner(store, RetentionConfig(failed=None, batch_pause=0)).prune()
    assert report.counts["jobs"] == 0 and report.kept == 1
    assert await store.get(child.id) is not None


async def test_a_failed_job_holding_its_concurrency_key_is_kept(store: Store, db: Db) -> None:
    holder = await finished(
        store, JobState.FAILED, max_attempts=1, key="tenant-1", limits=("key:tenant-1",)
    )
    free = await finished(store, JobState.FAILED, max_attempts=1)
    age(db, holder, 30)
    age(db, free, 30)
    counts = await prune(store)
    assert counts["jobs"] == 1
    assert await store.get(holder.id) is not None and await store.get(free.id) is None


async def test_a_dry_run_counts_and_deletes_nothing(store: Store, db: Db) -> None:
    jobs = [await finished(store) for _ in range(5)]
    for job in jobs:
        age(db, job, 2)
    report = await Pruner(store, RETENTION).prune(dry_run=True)
    assert report.counts["jobs"] == 5 and report.counts["artifacts"] == 5
    for job in jobs:
        assert await store.get(job.id) is not None
    # Batches of two: five jobs take three batches, and all go.
    assert (await prune(store))["jobs"] == 5


async def test_old_audit_rows_and_gone_workers_are_pruned(store: Store, db: Db) -> None:
    old = await store.append_audit("alice", "job.cancel", "job:1", "ok", None, None)
    new = await store.append_audit("bob", "job.cancel", "job:2", "ok", None, None)
    db.set_ago("tether_audit", "at", old.id, 91 * DAY)
    for worker, state, days in (
        ("gone", "dead", 8),
        ("recent", "stopped", 1),
        ("alive", "active", 30),
    ):
        await store.register_worker(worker, None, "h", 1, None, ["q"], 1)
        await store.set_worker_state(worker, state)
        db.set_ago("tether_workers", "heartbeat_at", worker, days * DAY)
    counts = await prune(store)
    assert (counts["audit"], counts["workers"]) == (1, 1)
    assert [e.id for e in await store.list_audit(10, 0)] == [new.id]
    assert {w.id for w in await store.list_workers()} == {"recent", "alive"}


async def test_pruned_rows_are_counted_by_kind_and_a_dry_run_is_not(store: Store, db: Db) -> None:
    def pruned(kind: str) -> float:
        return REGISTRY.get_sample_value("tether_pruned_total", {"kind": kind}) or 0.0

    jobs = [await finished(store) for _ in range(3)]
    for job in jobs:
        age(db, job, 2)
    before = {kind: pruned(kind) for kind in ("jobs", "artifacts")}
    await Pruner(store, RETENTION).prune(dry_run=True)
    assert pruned("jobs") == before["jobs"]
    await Pruner(store, RETENTION).prune()
    assert pruned("jobs") == before["jobs"] + 3
    assert pruned("artifacts") == before["artifacts"] + 3
