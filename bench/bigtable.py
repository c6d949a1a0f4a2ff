"""Benchmark-only: fill a migrated tether database with finished jobs, fast.

``load_finished(url, rows)`` inserts ``rows`` jobs in state ``succeeded`` (attempt 1, a
no-op task on the default queue, finished within the last hour) with the three event rows
each would have had (``-> queued``, ``queued -> running``, ``running -> succeeded``), in
one set-based statement per table: ``generate_series`` on PostgreSQL, a recursive CTE on
SQLite. Then it runs ``ANALYZE`` so the planner knows the table's new size.

A job cannot be *inserted* as ``succeeded`` through tether's rules (the insert trigger
refuses it), so the loader switches tether_jobs' triggers off for its one transaction:
``ALTER TABLE ... DISABLE TRIGGER USER`` on PostgreSQL; on SQLite, which cannot disable
a trigger, it drops them and re-creates them from their stored SQL in the same
transaction. Use it on a throwaway database only, with no worker running.
"""

from __future__ import annotations

import sqlite3
import time
from urllib.parse import urlsplit

from tether.store import parse_sqlite_path

#: Marks the loaded rows (the worker id of their one attempt).
LOADER = "bench-loader"
TASK = "bench.noop"

_EVENTS = (
    "(SELECT 1 AS o, NULL AS f, 'queued' AS t UNION ALL SELECT 2, 'queued', 'running' "
    "UNION ALL SELECT 3, 'running', 'succeeded')"
)

_PG_JOBS = f"""
INSERT INTO tether_jobs (task, args, queue, priority, state, attempt, max_attempts,
                         run_at, created_at, started_at, finished_at, worker_id, lease_token)
SELECT '{TASK}', '{{}}'::jsonb, 'default', 0, 'succeeded', 1, 3, t, t, t, t, '{LOADER}', 1
FROM (SELECT now() - interval '1 hour' + g * interval '1 microsecond' AS t
      FROM generate_series(1, %s) AS g) AS s
"""

_PG_EVENTS = f"""
INSERT INTO tether_job_events (job_id, from_state, to_state, at, worker_id)
SELECT j.id, v.f, v.t, j.finished_at, CASE WHEN v.o = 1 THEN NULL ELSE j.worker_id END
FROM tether_jobs j CROSS JOIN {_EVENTS} AS v
WHERE j.worker_id = '{LOADER}'
ORDER BY j.id, v.o
"""

_SQLITE_JOBS = f"""
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?)
INSERT INTO tether_jobs (task, args, queue, priority, state, attempt, max_attempts,
                         run_at, created_at, started_at, finished_at, worker_id, lease_token)
SELECT '{TASK}', '{{}}', 'default', 0, 'succeeded', 1, 3, t, t, t, t, '{LOADER}', 1
FROM (SELECT (julianday('now') - 2440587.5) * 86400.0 - 3600.0 + i * 0.000001 AS t FROM s)
"""

_SQLITE_EVENTS = _PG_EVENTS


def load_finished(url: str, rows: int) -> float:
    """Insert ``rows`` finished jobs (and their events) into ``url``; ANALYZE; return seconds.

    The database must already be migrated (open an App on it first).
    """
    start = time.perf_counter()
    if urlsplit(url).scheme.lower() == "sqlite":
        _load_sqlite(parse_sqlite_path(url), rows)
    else:
        _load_postgres(url, rows)
    return time.perf_counter() - start


def _load_postgres(url: str, rows: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("ALTER TABLE tether_jobs DISABLE TRIGGER USER")
            conn.execute(_PG_JOBS, (rows,))
            conn.execute(_PG_EVENTS)
            conn.execute("ALTER TABLE tether_jobs ENABLE TRIGGER USER")
        conn.execute("ANALYZE")


def _load_sqlite(path: str, rows: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        triggers = conn.execute(
            "SELECT name, sql FROM sqlite_master "
            "WHERE type = 'trigger' AND tbl_name = 'tether_jobs'"
        ).fetchall()
        for name, _ in triggers:
            conn.execute(f'DROP TRIGGER "{name}"')
        conn.execute(_SQLITE_JOBS, (rows,))
        conn.execute(_SQLITE_EVENTS)
        for _, sql in triggers:
            conn.execute(sql)
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()
