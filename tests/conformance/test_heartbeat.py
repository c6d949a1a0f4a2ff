"""Heartbeat: one write extends leases, flushes progress, touches the worker, reads requests."""

from __future__ import annotations

import json
import os
from datetime import timedelta

from tether.job import Beat, ControlRequest
from tether.store import Store

from .support import Db, assert_between, running_job


async def test_heartbeat_extends_the_lease_from_database_time(store: Store, db: Db) -> None:
    job = await running_job(store, "w1", lease=1.0)
    before = db.now()
    beat = await store.heartbeat("w1", [Beat(job.id, job.lease_token)], 120)
    after = db.now()
    assert beat.alive == {job.id}
    renewed = await store.get(job.id)
    assert renewed is not None
    lease = timedelta(seconds=120)
    assert_between(renewed.lease_expires_at, before + lease, after + lease)
    assert_between(renewed.heartbeat_at, before, after)
    assert renewed.lease_token == job.lease_token
    assert renewed.state == "running"


async def test_heartbeat_writes_progress_and_keeps_it_when_none_is_sent(store: Store) -> None:
    job = await running_job(store, "w1")
    await store.heartbeat("w1", [Beat(job.id, job.lease_token, 3, 10)], 60)
    first = await store.get(job.id)
    assert first is not None and (first.progress_current, first.progress_total) == (3, 10)
    await store.heartbeat("w1", [Beat(job.id, job.lease_token)], 60)
    kept = await store.get(job.id)
    assert kept is not None and (kept.progress_current, kept.progress_total) == (3, 10)
    await store.heartbeat("w1", [Beat(job.id, job.lease_token, 7, None)], 60)
    moved = await store.get(job.id)
    assert moved is not None and (moved.progress_current, moved.progress_total) == (7, 10)


async def test_heartbeat_extends_every_lease_of_the_worker_in_one_call(store: Store) -> None:
    jobs = [await running_job(store, "w1", lease=1.0) for _ in range(3)]
    beat = await store.heartbeat("w1", [Beat(j.id, j.lease_token) for j in jobs], 300)
    assert beat.alive == {j.id for j in jobs}
    for j in jobs:
        renewed = await store.get(j.id)
        assert renewed is not None and renewed.lease_expires_at is not None
        assert j.lease_expires_at is not None
        assert renewed.lease_expires_at - j.lease_expires_at > timedelta(seconds=250)


async def test_heartbeat_touches_the_worker_row(store: Store, db: Db) -> None:
    await store.register_worker("w1", "one", "host-a", os.getpid(), None, ["default"], 4)
    db.set_ago("tether_workers", "heartbeat_at", "w1", 3600)
    job = await running_job(store, "w1")
    before = db.now()
    await store.heartbeat("w1", [Beat(job.id, job.lease_token)], 60)
    after = db.now()
    [worker] = await store.list_workers()
    assert_between(worker.heartbeat_at, before, after)


async def test_heartbeat_with_no_leases_still_touches_the_worker_row(store: Store, db: Db) -> None:
    await store.register_worker("w1", None, "host-a", os.getpid(), None, ["default"], 1)
    db.set_ago("tether_workers", "heartbeat_at", "w1", 3600)
    before = db.now()
    beat = await store.heartbeat("w1", [], 60)
    assert beat.alive == frozenset() and beat.requests == ()
    [worker] = await store.list_workers()
    assert worker.heartbeat_at >= before - timedelta(milliseconds=2)


async def test_heartbeat_returns_pending_cancel_requests_with_force_flag(store: Store) -> None:
    soft = await running_job(store, "w1")
    hard = await running_job(store, "w1")
    calm = await running_job(store, "w1")
    beats = [Beat(j.id, j.lease_token) for j in (soft, hard, calm)]
    assert (await store.heartbeat("w1", beats, 60)).requests == ()

    await store.request_cancel(soft.id, "please", False, "alice")
    await store.request_cancel(hard.id, "now", True, "bob")
    beat = await store.heartbeat("w1", beats, 60)
    assert beat.alive == {soft.id, hard.id, calm.id}
    assert sorted(beat.requests, key=lambda r: r.job_id) == sorted(
        [ControlRequest(soft.id, cancel=True, force=False), ControlRequest(hard.id, True, True)],
        key=lambda r: r.job_id,
    )
    # A request stays pending (and is returned again) until the job stops.
    again = await store.heartbeat("w1", beats, 60)
    assert set(again.requests) == set(beat.requests)


async def test_heartbeat_does_not_return_requests_for_leases_it_lost(store: Store) -> None:
    job = await running_job(store, "w1")
    await store.request_cancel(job.id, None, True, None)
    beat = await store.heartbeat("w1", [Beat(job.id, job.lease_token + 1)], 60)
    assert beat.alive == frozenset() and beat.requests == ()


async def test_a_beat_that_lands_after_a_newer_one_counts_for_nothing(store: Store, db: Db) -> None:
    # The worker gave up on beat 1 (no answer in time), then beat 2 landed with the job
    # it claimed meanwhile. Beat 1 arriving late must not write its older list over it:
    # that job would then look dropped by a live worker.
    await store.register_worker("w1", None, "h", 1, None, ["q"], 1)
    job = await running_job(store, "w1")
    newer = await store.heartbeat("w1", [Beat(job.id, job.lease_token)], 60.0, [job.id], 2)
    late = await store.heartbeat("w1", [], 60.0, [], 1)
    assert newer.counted and not late.counted
    [(beats, holding)] = db.execute("SELECT beats, holding FROM tether_workers")
    listed = json.loads(holding) if isinstance(holding, str) else list(holding)
    assert (beats, listed) == (1, [job.id])
    assert (await store.heartbeat("w1", [], 60.0, [job.id], 3)).counted
