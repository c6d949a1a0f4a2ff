"""The API's tables through the Store protocol: tokens, the audit log, the event feed."""

from __future__ import annotations

from datetime import timedelta

from tether.states import JobState
from tether.store import Store

from .support import Db, enqueue_one


async def test_tokens_unique_among_active_names(store: Store) -> None:
    first = await store.create_token("ci", "admin", "h1")
    assert first is not None and first.role == "admin" and first.revoked_at is None
    assert await store.create_token("ci", "viewer", "h2") is None
    assert await store.find_token("h1") == first
    assert await store.find_token("h2") is None
    assert await store.revoke_token("ci") and not await store.revoke_token("ci")
    assert await store.find_token("h1") is None
    again = await store.create_token("ci", "member", "h3")
    assert again is not None and again.id != first.id
    listed = await store.list_tokens()
    assert [(t.name, t.role, t.revoked_at is None) for t in listed] == [
        ("ci", "admin", False),
        ("ci", "member", True),
    ]
    assert listed[0].token_hash == "h1"


async def test_audit_rows_newest_first_in_database_time(store: Store, db: Db) -> None:
    before = db.now()
    a = await store.append_audit("alice", "job.cancel", "job:1", "ok", "r1", "why")
    b = await store.append_audit("bob", "job.cancel", "job:1", "denied", None, None)
    assert before - timedelta(seconds=1) <= a.at <= db.now() + timedelta(seconds=1)
    assert (a.actor, a.action, a.target, a.result, a.request_id, a.detail) == (
        "alice", "job.cancel", "job:1", "ok", "r1", "why"
    )  # fmt: skip
    assert await store.list_audit(10, 0) == [b, a]
    assert await store.list_audit(1, 1) == [a]


async def test_feed_filters_and_resumes(store: Store) -> None:
    assert await store.last_event_id() == 0
    # A feed says it follows, so that every transition is stored (migration 0028).
    await store.announce_follower(60.0)
    x = await enqueue_one(store, queue="x", owner="alice")
    y = await enqueue_one(store, queue="y", owner="bob")
    await store.request_cancel(x.id, "stop", False, "alice")

    async def feed(after: int = 0, **flt: object) -> list[tuple[int, str]]:
        args = {"job_id": None, "queue": None, "owner": None, "states": None, **flt}
        rows = await store.feed(after, limit=100, **args)  # type: ignore[arg-type]
        return [(r.event.job_id, r.event.to_state.value) for r in rows]

    assert await feed() == [(x.id, "queued"), (y.id, "queued"), (x.id, "cancelled")]
    assert await feed(queue="y") == [(y.id, "queued")]
    assert await feed(owner="alice") == [(x.id, "queued"), (x.id, "cancelled")]
    assert await feed(states=["cancelled"]) == [(x.id, "cancelled")]
    assert await feed(job_id=y.id) == [(y.id, "queued")]
    last = await store.last_event_id()
    assert await feed(after=last) == []
    [row] = await store.feed(last - 1, job_id=None, queue=None, owner=None, states=None, limit=5)
    assert (row.queue, row.task, row.owner, row.event.from_state) == (
        "x", x.task, "alice", JobState.QUEUED
    )  # fmt: skip
    # A deleted job's events stay in the feed, without the job's details.
    await store.delete(y.id, "test")
    rows = await store.feed(0, job_id=y.id, queue=None, owner=None, states=None, limit=5)
    assert rows and all(r.queue is None and r.owner is None for r in rows)


async def test_cancellations_of_an_owner(store: Store) -> None:
    mine = await enqueue_one(store, owner="alice")
    theirs = await enqueue_one(store, owner="bob")
    for job, cid in ((mine, "c1"), (theirs, "c2")):
        await store.create_cancellation(
            cid,
            job_id=job.id,
            request_id=None,
            reason="r",
            force=False,
            cascade=True,
            initiated_by="t",
        )
    assert [c.id for c in await store.list_owned_cancellations("alice", limit=10, offset=0)] == [
        "c1"
    ]
    assert await store.list_owned_cancellations("alice", limit=10, offset=1) == []
    assert await store.list_owned_cancellations("carol", limit=10, offset=0) == []


async def test_cancellations_filtered_by_status(store: Store) -> None:
    for cid in ("c1", "c2", "c3"):
        job = await enqueue_one(store)
        await store.create_cancellation(
            cid,
            job_id=job.id,
            request_id=None,
            reason="r",
            force=False,
            cascade=True,
            initiated_by="t",
        )
    await store.update_cancellation(
        "c2", status="partial", steps=[], result={"errors": ["e"]}, error="e", final=True
    )
    assert [c.id for c in await store.list_cancellations(limit=10, offset=0, status="partial")] == [
        "c2"
    ]
    assert await store.list_cancellations(limit=10, offset=0, status="failed") == []
    assert {c.id for c in await store.list_cancellations(limit=10, offset=0)} == {"c1", "c2", "c3"}
