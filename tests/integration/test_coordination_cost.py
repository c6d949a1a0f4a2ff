"""Coordination whose cost does not grow with the fleet (PostgreSQL): transitions notify
``tether_changed`` only while a process listens there, the rescue reads through indexes
only the jobs it hands back, and only the maintenance leader rescues."""

from __future__ import annotations

import psycopg
import pytest

import tether
from tests.conformance.support import outcome, running_job
from tests.helpers import eventually, fast_config
from tether import App, JobState, Worker
from tether import hints as h
from tether.store import create_store
from tether.store.postgres import PostgresStore
from tether.store.sql.postgres.maintenance import RESCUE as Q_RESCUE

pytestmark = pytest.mark.postgres


def _notes(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """Notifications ``conn`` received so far."""
    conn.execute("SELECT 1")  # delivers what arrived meanwhile
    return [n.payload for n in conn.notifies(timeout=0.2)]


async def test_a_completion_notifies_waiters_only_while_a_process_listens_for_them(
    pg_url: str,
) -> None:
    store = create_store(pg_url)
    assert isinstance(store, PostgresStore)
    await store.migrate()
    try:
        with psycopg.connect(pg_url, autocommit=True) as ear:
            # A bare LISTEN, without saying so in tether_listeners: nobody is waiting.
            ear.execute("LISTEN tether_changed")
            quiet = await running_job(store, "w1")
            await store.finish("w1", [outcome(quiet, JobState.SUCCEEDED)])
            assert _notes(ear) == []

            # A waiter for job results: its store says it listens, and hears completions.
            with store.hints.subscribe(h.CHANGED) as sub:
                await store.listen()
                await eventually(lambda: _listed(pg_url))
                heard = await running_job(store, "w1")
                await store.finish("w1", [outcome(heard, JobState.SUCCEEDED)])

                async def woken() -> bool:
                    # (The LISTEN connection's start wakes every waiter once, too.)
                    return str(heard.id) in await sub.get(0.5)

                await eventually(woken)
            assert _notes(ear) == [str(heard.id)]
    finally:
        await store.close()


async def _listed(url: str) -> bool:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM tether_listeners WHERE channel = 'tether_changed' "
            "AND until > now()"
        )
        row = await cur.fetchone()
        return bool(row and row[0])


async def test_the_rescue_reads_through_indexes_whatever_the_history(pg_url: str) -> None:
    store = create_store(pg_url)
    await store.migrate()
    await store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # Thousands of running jobs with live leases, thousands of worker rows long gone.
        conn.execute(
            "INSERT INTO tether_workers (id, host, pid, queues, concurrency, state, heartbeat_at) "
            "SELECT 'w' || g, 'h' || g % 8, g, 'default', 10, "
            "CASE WHEN g <= 64 THEN 'active' WHEN g % 2 = 0 THEN 'stopped' ELSE 'dead' END, "
            "now() - CASE WHEN g <= 64 THEN interval '0' ELSE interval '2 days' END "
            "FROM generate_series(1, 5000) g"
        )
        conn.execute(
            "INSERT INTO tether_jobs (task, args, queue, state, max_attempts) "
            "SELECT 't', '{}', 'default', 'queued', 3 FROM generate_series(1, 20000)"
        )
        conn.execute(
            "UPDATE tether_jobs SET state = 'running', worker_id = 'w' || (id % 64 + 1), "
            "lease_token = 1, attempt = 1, lease_expires_at = now() + interval '1 hour' "
            "WHERE id <= 3000"
        )
        conn.execute("VACUUM ANALYZE")  # the shared server runs without autovacuum
        with conn.transaction(force_rollback=True):
            (plan,) = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + Q_RESCUE, {"quiet": "{}"}
            ).fetchone() or ([],)
        (dead_check,) = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT id FROM tether_workers "
            "WHERE state IN ('active', 'draining')"
        ).fetchone() or ([],)
    scans = _scans(plan) + _scans(dead_check)
    # Scans that ran, with the rows they read: none of them walks a whole table (20,000
    # jobs, 5,000 worker rows); together they read the 3,000 running jobs once and the
    # 64 live workers, nothing of the jobs waiting or the workers long gone.
    assert scans and not [s for s in scans if s[0] == "Seq Scan"], scans
    assert sum(rows for _, rows in scans) <= 3000 + 64 + 2, scans


def _scans(node: object) -> list[tuple[str, int]]:
    """(type, rows read) of every scan node of a JSON plan that ran."""
    found: list[tuple[str, int]] = []
    if isinstance(node, dict):
        kind = str(node.get("Node Type", ""))
        # (A bitmap index scan's rows are read again by its heap scan: count them once.)
        if kind.endswith("Scan") and kind != "Bitmap Index Scan" and node.get("Actual Loops"):
            read = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
            found.append((kind, read * int(node["Actual Loops"])))
        for value in node.values():
            found += _scans(value)
    elif isinstance(node, list):
        for value in node:
            found += _scans(value)
    return found


async def test_only_the_maintenance_leader_rescues(pg_url: str) -> None:
    apps = [App(pg_url), App(pg_url)]
    for app in apps:

        @app.task(name="noop")
        async def noop(ctx: tether.JobContext) -> None:
            return None

    workers = [Worker(app, fast_config()) for app in apps]
    try:
        for worker in workers:
            await worker.start(services=False)
        first, second = workers
        assert await first.maintenance.leader.run_once() is True
        assert await second.maintenance.leader.run_once() is False
        assert first.maintenance.rescuer.due() and not second.maintenance.rescuer.due()
        # Its own pass still works when asked (a worker makes one as it starts).
        assert await second.maintenance.rescuer.run_once() == []
    finally:
        for worker in workers:
            await worker.stop()
        for app in apps:
            await app.close()
