"""Worker rows: registration, state changes, listing, and dead-process detection."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys

import psycopg
import pytest

from tether import procinfo
from tether.store import Store

from .support import Db, assert_between, enqueue_one, running_job


async def finished_pid() -> int:
    """The pid of a child process that has exited and been reaped."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()
    assert not procinfo.pid_alive(proc.pid, None)
    return proc.pid


async def test_registered_worker_is_listed_as_active(store: Store, db: Db) -> None:
    before = db.now()
    await store.register_worker("w1", "crawler", "host-a", 4242, 99, ["q1", "q2"], 8)
    after = db.now()
    [w] = await store.list_workers()
    assert (w.id, w.name, w.host, w.pid, w.state) == ("w1", "crawler", "host-a", 4242, "active")
    assert_between(w.started_at, before, after)
    assert_between(w.heartbeat_at, before, after)
    assert w.running_jobs == 0


async def test_list_workers_counts_the_leases_each_holds(store: Store) -> None:
    await store.register_worker("w1", None, "h", 1, None, ["q"], 4)
    await store.register_worker("w2", None, "h", 2, None, ["q"], 4)
    for _ in range(3):
        await running_job(store, "w1")
    await running_job(store, "w2")
    counts = {w.id: w.running_jobs for w in await store.list_workers()}
    assert counts == {"w1": 3, "w2": 1}


async def test_list_workers_shows_the_newest_first(store: Store, db: Db) -> None:
    for n in range(3):
        await store.register_worker(f"w{n}", None, "h", n + 1, None, ["q"], 1)
        db.set_ago("tether_workers", "started_at", f"w{n}", 100 - n)
    assert [w.id for w in await store.list_workers()] == ["w2", "w1", "w0"]


async def test_set_worker_state_moves_the_worker(store: Store) -> None:
    await store.register_worker("w1", None, "h", 1, None, ["q"], 1)
    for state in ("draining", "stopped", "dead", "active"):
        await store.set_worker_state("w1", state)
        [w] = await store.list_workers()
        assert w.state == state


async def test_worker_whose_process_is_gone_is_marked_dead(store: Store) -> None:
    host = procinfo.hostname()
    me = os.getpid()
    gone = await finished_pid()
    await store.register_worker("w-gone", None, host, gone, None, ["q"], 1)
    await store.register_worker("w-live", None, host, me, procinfo.start_time(me), ["q"], 1)
    elsewhere = dataclasses.replace(procinfo.pid_space(), boot_id="another-boot")
    await store.register_worker("w-elsewhere", None, host, gone, None, ["q"], 1, elsewhere)
    dead = await store.mark_dead_workers(procinfo.process_gone, 3600)
    assert dead == ["w-gone"]
    states = {w.id: w.state for w in await store.list_workers()}
    assert states == {"w-gone": "dead", "w-live": "active", "w-elsewhere": "active"}
    # Already dead: not reported again.
    assert await store.mark_dead_workers(procinfo.process_gone, 3600) == []


@pytest.mark.parametrize(
    "field",
    ["boot_id", "pid_ns", "machine_id"],
    ids=["other-boot", "other-pid-ns", "other-machine"],
)
async def test_pid_of_a_worker_in_another_pid_space_is_not_checked(
    store: Store, field: str
) -> None:
    # Same host name, same pid numbers: only the recorded pid space tells them apart.
    host = procinfo.hostname()
    gone = await finished_pid()
    elsewhere = dataclasses.replace(procinfo.pid_space(), **{field: "not-ours"})
    await store.register_worker("w-other", None, host, gone, None, ["q"], 1, elsewhere)
    job = await running_job(store, "w-other", lease=3600)
    assert await store.mark_dead_workers(procinfo.process_gone, 3600) == []
    assert await store.rescue() == []
    [w] = await store.list_workers()
    still = await store.get(job.id)
    assert w.state == "active" and still is not None and still.state.value == "running"


async def test_worker_registered_without_a_known_pid_space_is_not_checked(store: Store) -> None:
    unknown = procinfo.PidSpace(boot_id=None, pid_ns=None, machine_id=None)
    await store.register_worker("w-old", None, "h", await finished_pid(), None, ["q"], 1, unknown)
    assert await store.mark_dead_workers(procinfo.process_gone, 3600) == []


async def test_worker_whose_pid_was_reused_is_marked_dead(store: Store) -> None:
    host = procinfo.hostname()
    me = os.getpid()
    start = procinfo.start_time(me)
    assert start is not None
    await store.register_worker("w-old", None, host, me, start - 1, ["q"], 1)
    assert await store.mark_dead_workers(procinfo.process_gone, 3600) == ["w-old"]


async def test_stopped_workers_are_left_alone(store: Store) -> None:
    host = procinfo.hostname()
    await store.register_worker("w1", None, host, await finished_pid(), None, ["q"], 1)
    await store.set_worker_state("w1", "stopped")
    assert await store.mark_dead_workers(procinfo.process_gone, 3600) == []
    [w] = await store.list_workers()
    assert w.state == "stopped"


async def test_marking_a_worker_dead_lets_rescue_take_its_jobs(store: Store) -> None:
    host = procinfo.hostname()
    await store.register_worker("w1", None, host, await finished_pid(), None, ["q"], 1)
    job = await running_job(store, "w1", lease=3600)
    assert await store.rescue() == []
    assert await store.mark_dead_workers(procinfo.process_gone, 3600) == ["w1"]
    assert [j.id for j in await store.rescue()] == [job.id]


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_lost_session_is_death_only_for_a_worker_watched_quiet(
    store: Store, db: Db
) -> None:
    # The server's clock stepped forward: by database time the worker's last beat is
    # long past, and its recorded session is not on this server. Only the rescuer's own
    # watch of its beat count (monotonic) may say it is dead.
    await store.register_worker("w1", None, "h", 1, None, ["q"], 1)
    db.execute(
        "UPDATE tether_workers SET backend_pid = 2147483647, "
        "heartbeat_at = now() - interval '1 hour' WHERE id = %s",
        ("w1",),
    )
    assert await store.mark_dead_workers(lambda _p: False, 5.0, still=[]) == []
    assert await store.mark_dead_workers(lambda _p: False, 5.0, still=["other"]) == []
    assert await store.mark_dead_workers(lambda _p: False, 5.0, still=["w1"]) == ["w1"]


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_worker_presumed_dead_claims_nothing_until_a_beat_revives_it(
    store: Store, db: Db, db_url: str
) -> None:
    # After a failover a live worker may be marked dead (its session looked gone) while
    # a claim of its is in flight: the rescue would take that fresh job straight back.
    await store.register_worker("w1", None, "h", 1, None, ["q"], 1)
    await enqueue_one(store, queue="q")
    db.execute("UPDATE tether_workers SET state = 'dead' WHERE id = %s", ("w1",))
    assert await store.claim("w1", ["q"], ["t"], 1, 60.0) == []
    # A marking in flight holds the row: the claim neither waits nor takes anything.
    db.execute("UPDATE tether_workers SET state = 'active' WHERE id = %s", ("w1",))
    with psycopg.connect(db_url) as marking:
        marking.execute("SELECT 1 FROM tether_workers WHERE id = 'w1' FOR UPDATE")
        assert await asyncio.wait_for(store.claim("w1", ["q"], ["t"], 1, 60.0), 5) == []
        marking.rollback()
    await store.heartbeat("w1", [], 60.0)
    assert len(await store.claim("w1", ["q"], ["t"], 1, 60.0)) == 1
