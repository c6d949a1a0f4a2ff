"""What tether_jobs' indexes cost per job, and what the listings cost at a million rows.

``python bench/indexcost.py`` measures, on a private throwaway PostgreSQL cluster
(``initdb`` in a temp dir, ``pg_stat_statements`` loaded, ``fsync = off``) and on a
SQLite file:

- per job of a drain of ``--jobs`` no-op jobs (enqueue, claim, finish): the WAL bytes
  (``pg_current_wal_lsn()`` around enqueue and drain, after a checkpoint) and their
  split by relation and record type (``pg_walinspect``), the server time of the
  top-level statements, and the share of HOT updates (PostgreSQL only);
- at ``--rows`` finished jobs (``bigtable.load_finished``; one in a thousand then made
  ``failed``, plus ``--active`` queued jobs): the median of five runs of each listing the
  dashboard, the API and the CLI send: a job's history, the counts by state, the queue
  counts, the jobs list by state and the overview's lists.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
from bigtable import load_finished
from run import DRAIN_CONFIG, tether_drain
from tests.pgcluster import make_cluster
from tether import App

RUNS = 5
TOP_WAL = 12  # relation and record kinds shown


async def _noop(ctx: Any) -> None:
    return None


def _listings(app: App, some_job: int) -> dict[str, Callable[[], Awaitable[Any]]]:
    jobs = app.jobs
    return {
        "a job's history (job show)": lambda: jobs.events(some_job),
        "count_by_state (stats)": jobs.stats,
        "queue counts": app.queues.list,
        "queue backlog (autoscalers)": app.queues.backlog,
        "list state=queued limit 50": lambda: jobs.list(state="queued", limit=50),
        "list state=running limit 10000": lambda: jobs.list(state="running", limit=10_000),
        "list state=failed limit 50": lambda: jobs.list(state="failed", limit=50),
        "list state=succeeded limit 50": lambda: jobs.list(state="succeeded", limit=50),
        "list succeeded+failed limit 1000": lambda: jobs.list(
            state=["succeeded", "failed"], limit=1000
        ),
        "list all limit 500": lambda: jobs.list(limit=500),
    }


async def _time_listings(url: str, active: int, some_job: int) -> None:
    app = App(url)
    idle = app.task(name="bench.idle")(_noop)
    try:
        await app.store()
        if active:
            await app.enqueue_many([(idle, {})] * active)
        for name, call in _listings(app, some_job).items():
            await call()
            times = []
            for _ in range(RUNS):
                start = time.perf_counter()
                await call()
                times.append(time.perf_counter() - start)
            print(f"  {name:<36} {1000 * statistics.median(times):8.1f} ms")
    finally:
        await app.close()


def _fail_some(url: str) -> None:
    """Make one loaded job in a thousand ``failed`` (triggers off: a benchmark's shortcut)."""
    if url.startswith("sqlite"):
        import sqlite3

        from tether.store import parse_sqlite_path

        conn = sqlite3.connect(parse_sqlite_path(url), isolation_level=None)
        conn.execute("PRAGMA recursive_triggers = off")
        triggers = conn.execute(
            "SELECT name, sql FROM sqlite_master "
            "WHERE type = 'trigger' AND tbl_name = 'tether_jobs'"
        ).fetchall()
        conn.execute("BEGIN IMMEDIATE")
        for name, _ in triggers:
            conn.execute(f'DROP TRIGGER "{name}"')
        conn.execute("UPDATE tether_jobs SET state = 'failed' WHERE id % 1000 = 0")
        for _, sql in triggers:
            conn.execute(sql)
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
        conn.close()
        return
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("ALTER TABLE tether_jobs DISABLE TRIGGER USER")
            conn.execute("UPDATE tether_jobs SET state = 'failed' WHERE id % 1000 = 0")
            conn.execute("ALTER TABLE tether_jobs ENABLE TRIGGER USER")
        conn.execute("VACUUM ANALYZE tether_jobs")


def _big(url: str, rows: int, active: int) -> None:
    asyncio.run(_migrate(url))
    seconds = load_finished(url, rows)
    _fail_some(url)
    print(f"  ({rows} finished jobs loaded in {seconds:.0f} s; {active} queued)")
    asyncio.run(_time_listings(url, active, rows // 2))
    if not url.startswith("sqlite"):
        _explain_count(url)


def _explain_count(url: str) -> None:
    """The scans of the counts by state, as the store sends them."""
    from tether.store.sql.postgres.jobs import COUNT_BY_STATE

    with psycopg.connect(url, autocommit=True) as conn:
        plan = conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + COUNT_BY_STATE).fetchall()
    scans = [r[0].strip().lstrip("-> ") for r in plan if "Scan" in r[0] or "Execution" in r[0]]
    print("  count_by_state's plan: " + "; ".join(scans))


async def _migrate(url: str) -> None:
    app = App(url)
    try:
        await app.store()
    finally:
        await app.close()


def _pg_drain(url: str, jobs: int) -> None:
    asyncio.run(_migrate(url))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("CHECKPOINT")
        conn.execute("SELECT pg_stat_statements_reset()")
        start = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
    with tempfile.TemporaryDirectory() as workdir:
        rate, _ = asyncio.run(tether_drain(url, jobs, DRAIN_CONFIG, Path(workdir)))
    with psycopg.connect(url, autocommit=True) as conn:
        wal = conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", start).fetchone()
        by_relation = _wal_by_relation(conn, str(start[0]) if start else "0/0")
        ms = conn.execute(
            "SELECT sum(total_exec_time) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = current_database() AND s.toplevel"
        ).fetchone()
        upd = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tether_jobs'"
        ).fetchone()
    assert wal is not None and ms is not None and upd is not None
    print(f"  drain: {rate:.0f} jobs/s")
    print(f"  WAL: {int(wal[0]) / jobs:.0f} bytes per job (enqueue + claim + finish)")
    print(f"  server time: {1000 * float(ms[0]) / jobs:.0f} µs per job (top-level statements)")
    print(f"  updates of tether_jobs: {upd[0]}, of which HOT {upd[1]}")
    print("  WAL per job by relation and record (pg_walinspect; the largest):")
    for (relation, kind), (count, size) in by_relation[:TOP_WAL]:
        print(f"    {relation:<28} {kind:<20} {size / jobs:6.0f} bytes {count / jobs:5.2f} records")


def _wal_by_relation(
    conn: psycopg.Connection[Any], start: str
) -> list[tuple[tuple[str, str], tuple[int, int]]]:
    """The WAL records since ``start``, summed by relation and record type, largest
    first (``pg_walinspect``; PostgreSQL 15 and later)."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    names = {
        str(node): name
        for node, name in conn.execute(
            "SELECT pg_relation_filenode(oid), relname FROM pg_class "
            "WHERE pg_relation_filenode(oid) IS NOT NULL"
        )
    }
    sums: dict[tuple[str, str], tuple[int, int]] = {}
    for rmgr, record, length, ref in conn.execute(
        "SELECT resource_manager, record_type, record_length, block_ref "
        "FROM pg_get_wal_records_info(%s::pg_lsn, pg_current_wal_lsn())",
        (start,),
    ):
        found = re.search(r"rel \d+/\d+/(\d+)", ref or "")
        relation = str(names.get(found.group(1), found.group(1))) if found else "-"
        key = (relation, f"{rmgr} {(record or '').split()[0]}")
        count, size = sums.get(key, (0, 0))
        sums[key] = (count + 1, size + int(length))
    return sorted(sums.items(), key=lambda kv: -kv[1][1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per drain (20000)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished jobs (1000000)")
    parser.add_argument("--active", type=int, default=1000, help="queued jobs (1000)")
    parser.add_argument("--only", choices=("postgres", "sqlite"), default=None)
    args = parser.parse_args()
    if args.only != "sqlite":
        cluster = make_cluster()
        if cluster is None:
            sys.exit("PostgreSQL's binaries (initdb, pg_ctl) are not installed")
        try:
            with open(cluster.data / "postgresql.conf", "a") as conf:
                conf.write(
                    "shared_preload_libraries = 'pg_stat_statements'\n"
                    "max_wal_size = '8GB'\ncheckpoint_timeout = '1h'\n"
                )
            cluster.restart()
            print("PostgreSQL")
            with peers.fresh_database(cluster.admin_url, "indexcost_drain") as url:
                _pg_drain(url, args.jobs)
            with peers.fresh_database(cluster.admin_url, "indexcost_big") as url:
                _big(url, args.rows, args.active)
        finally:
            cluster.destroy()
    if args.only != "postgres":
        print("SQLite")
        with tempfile.TemporaryDirectory() as tmp:
            _big(f"sqlite:///{tmp}/big.db", args.rows, args.active)


if __name__ == "__main__":
    main()
