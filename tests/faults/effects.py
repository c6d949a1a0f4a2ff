"""The jobs' side effect: a fenced write into the job's own database.

``fault_effects`` holds at most one effect per job (its primary key): an attempt's
effect replaces the previous attempt's, and only while that attempt's lease token is
still current and the job still ``running``. Every try, accepted or rejected, is also
appended to ``fault_effect_log``, which is how stale writes are counted.

``fault_step_effects`` is the durable scenario's: one row per step a job's attempt ran,
written in the step's fenced transaction (``ctx.transaction()``), so it commits with the
step's record or not at all. It has no unique key on purpose: a step whose function
committed twice, or a zombie's write that got through, shows as a second row.

On PostgreSQL the check locks the job row ``FOR SHARE``, so a rescue or a claim cannot
bump the token between the check and the write; on SQLite ``BEGIN IMMEDIATE`` holds the
file's write lock for the same purpose.

The schema also keeps what the pruner (or anything else) deletes: triggers copy every
deleted job, event and dependency link into ``fault_gone_*``, so the invariants are
checked over every job a scenario made, pruned or not, and a job deleted before it
ended shows as one. And it notes every step back of a rate bucket's clock
(``fault_bucket_steps``): a bucket whose ``refilled_at`` moves back credits the same
interval twice.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS fault_effects (
    job_id      BIGINT PRIMARY KEY,
    lease_token BIGINT NOT NULL,
    attempt     INTEGER NOT NULL,
    pid         INTEGER NOT NULL,
    writes      INTEGER NOT NULL DEFAULT 1,
    at          DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_step_effects (
    job_id      BIGINT NOT NULL,
    step        TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    lease_token BIGINT NOT NULL,
    pid         INTEGER NOT NULL,
    at          DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_effect_log (
    id          BIGSERIAL PRIMARY KEY,
    job_id      BIGINT NOT NULL,
    lease_token BIGINT NOT NULL,
    pid         INTEGER NOT NULL,
    accepted    BOOLEAN NOT NULL,
    at          DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_gone_jobs (
    id               BIGINT PRIMARY KEY,
    task             TEXT NOT NULL,
    state            TEXT NOT NULL,
    attempt          INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    lease_token      BIGINT NOT NULL,
    leased           BOOLEAN NOT NULL,
    parent_id        BIGINT,
    waiting_children BOOLEAN NOT NULL,
    idempotency_key  TEXT,
    at               DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_gone_events (
    id         BIGINT PRIMARY KEY,
    job_id     BIGINT NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    at         DOUBLE PRECISION NOT NULL,
    worker_id  TEXT,
    actor      TEXT,
    reason     TEXT,
    rank       INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS fault_gone_deps (
    job_id     BIGINT NOT NULL,
    depends_on BIGINT NOT NULL
);
CREATE OR REPLACE FUNCTION fault_keep_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_gone_jobs VALUES (OLD.id, OLD.task, OLD.state, OLD.attempt,
        OLD.max_attempts, OLD.lease_token, OLD.lease_expires_at IS NOT NULL, OLD.parent_id,
        OLD.waiting_children, OLD.idempotency_key, extract(epoch FROM clock_timestamp()))
    ON CONFLICT DO NOTHING;
    -- The transitions tether reads off the job's row (tether_job_history, migration
    -- 0028) go with the row: keep them as the stored ones are kept, by the same rules,
    -- against the stored ones, deleted already (kept above) or not yet.
    WITH old AS (
        SELECT OLD.id > COALESCE((SELECT since_job FROM tether_lighter_history), 0) AS lighter
    ), stored AS (
        SELECT id, from_state, to_state, extract(epoch FROM at) AS at
        FROM tether_job_events WHERE job_id = OLD.id
        UNION ALL
        SELECT id, from_state, to_state, at FROM fault_gone_events
        WHERE job_id = OLD.id AND id > 0
    )
    INSERT INTO fault_gone_events (id, job_id, from_state, to_state, at, worker_id, actor,
                                   reason, rank)
    SELECT -(OLD.id * 4 + d.rank), OLD.id, d.src, d.dst, d.at, d.worker, d.actor, d.reason,
           d.rank
    FROM (
        SELECT 0 AS rank, NULL AS src, 'queued' AS dst, extract(epoch FROM OLD.created_at)
                   AS at, NULL AS worker, 'enqueue' AS actor, NULL AS reason
        WHERE NOT EXISTS (SELECT 1 FROM stored WHERE from_state IS NULL)
        UNION ALL
        SELECT 2, COALESCE((SELECT to_state FROM stored WHERE to_state <> 'succeeded'
                            ORDER BY id DESC LIMIT 1), 'queued'),
               'running', extract(epoch FROM OLD.started_at), OLD.worker_id, 'worker', NULL
        WHERE OLD.state IN ('running', 'succeeded') AND OLD.started_at IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM stored WHERE to_state = 'running'
                          AND at = extract(epoch FROM OLD.started_at))
        UNION ALL
        SELECT 3, 'running', 'succeeded', extract(epoch FROM OLD.finished_at), OLD.worker_id,
               OLD.actor, OLD.reason
        WHERE OLD.state = 'succeeded' AND OLD.finished_at IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM stored WHERE to_state = 'succeeded')
    ) AS d
    WHERE (SELECT lighter FROM old)
    ON CONFLICT DO NOTHING;
    RETURN OLD;
END $$;
CREATE OR REPLACE FUNCTION fault_keep_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_gone_events VALUES (OLD.id, OLD.job_id, OLD.from_state, OLD.to_state,
        extract(epoch FROM OLD.at), OLD.worker_id, OLD.actor, OLD.reason,
        CASE WHEN OLD.from_state IS NULL THEN 0 WHEN OLD.to_state = 'succeeded' THEN 3 ELSE 1 END)
    ON CONFLICT DO NOTHING;
    RETURN OLD;
END $$;
CREATE OR REPLACE FUNCTION fault_keep_dep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_gone_deps VALUES (OLD.job_id, OLD.depends_on);
    RETURN OLD;
END $$;
CREATE OR REPLACE TRIGGER fault_keep_job AFTER DELETE ON tether_jobs
    FOR EACH ROW EXECUTE FUNCTION fault_keep_job();
CREATE OR REPLACE TRIGGER fault_keep_event AFTER DELETE ON tether_job_events
    FOR EACH ROW EXECUTE FUNCTION fault_keep_event();
CREATE OR REPLACE TRIGGER fault_keep_dep AFTER DELETE ON tether_dependencies
    FOR EACH ROW EXECUTE FUNCTION fault_keep_dep();
CREATE TABLE IF NOT EXISTS fault_bucket_steps (
    bucket  TEXT NOT NULL,
    old_at  DOUBLE PRECISION NOT NULL,
    new_at  DOUBLE PRECISION NOT NULL,
    tokens  DOUBLE PRECISION NOT NULL,
    at      DOUBLE PRECISION NOT NULL
);
CREATE OR REPLACE FUNCTION fault_bucket_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_bucket_steps VALUES (NEW.id, extract(epoch FROM OLD.refilled_at),
        extract(epoch FROM NEW.refilled_at), NEW.tokens, extract(epoch FROM clock_timestamp()));
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER fault_bucket_step AFTER UPDATE ON tether_rate_limits
    FOR EACH ROW WHEN (NEW.refilled_at < OLD.refilled_at
                       AND NEW.per_second = OLD.per_second AND NEW.burst = OLD.burst)
    EXECUTE FUNCTION fault_bucket_step();
"""

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS fault_effects (
    job_id      INTEGER PRIMARY KEY,
    lease_token INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    pid         INTEGER NOT NULL,
    writes      INTEGER NOT NULL DEFAULT 1,
    at          REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_step_effects (
    job_id      INTEGER NOT NULL,
    step        TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    lease_token INTEGER NOT NULL,
    pid         INTEGER NOT NULL,
    at          REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_effect_log (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      INTEGER NOT NULL,
    lease_token INTEGER NOT NULL,
    pid         INTEGER NOT NULL,
    accepted    INTEGER NOT NULL,
    at          REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_gone_jobs (
    id               INTEGER PRIMARY KEY,
    task             TEXT NOT NULL,
    state            TEXT NOT NULL,
    attempt          INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    lease_token      INTEGER NOT NULL,
    leased           INTEGER NOT NULL,
    parent_id        INTEGER,
    waiting_children INTEGER NOT NULL,
    idempotency_key  TEXT,
    at               REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_gone_events (
    id         INTEGER PRIMARY KEY,
    job_id     INTEGER NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    at         REAL NOT NULL,
    worker_id  TEXT,
    actor      TEXT,
    reason     TEXT,
    rank       INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS fault_gone_deps (
    job_id     INTEGER NOT NULL,
    depends_on INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS fault_keep_job AFTER DELETE ON tether_jobs BEGIN
    INSERT OR IGNORE INTO fault_gone_jobs VALUES (OLD.id, OLD.task, OLD.state, OLD.attempt,
        OLD.max_attempts, OLD.lease_token, OLD.lease_expires_at IS NOT NULL, OLD.parent_id,
        OLD.waiting_children, OLD.idempotency_key, (julianday('now') - 2440587.5) * 86400.0);
END;
CREATE TRIGGER IF NOT EXISTS fault_keep_event AFTER DELETE ON tether_job_events BEGIN
    INSERT OR IGNORE INTO fault_gone_events VALUES (OLD.id, OLD.job_id, OLD.from_state,
        OLD.to_state, OLD.at, OLD.worker_id, OLD.actor, OLD.reason,
        CASE WHEN OLD.from_state IS NULL THEN 0 WHEN OLD.to_state = 'succeeded' THEN 3 ELSE 1 END);
END;
CREATE TRIGGER IF NOT EXISTS fault_keep_dep AFTER DELETE ON tether_dependencies BEGIN
    INSERT INTO fault_gone_deps VALUES (OLD.job_id, OLD.depends_on);
END;
CREATE TABLE IF NOT EXISTS fault_bucket_steps (
    bucket  TEXT NOT NULL,
    old_at  REAL NOT NULL,
    new_at  REAL NOT NULL,
    tokens  REAL NOT NULL,
    at      REAL NOT NULL
);
CREATE TRIGGER IF NOT EXISTS fault_bucket_step AFTER UPDATE ON tether_rate_limits
WHEN NEW.refilled_at < OLD.refilled_at AND NEW.per_second = OLD.per_second
     AND NEW.burst = OLD.burst BEGIN
    INSERT INTO fault_bucket_steps VALUES (NEW.id, OLD.refilled_at, NEW.refilled_at,
        NEW.tokens, (julianday('now') - 2440587.5) * 86400.0);
END;
"""

# One statement: lock the job row if the lease is current, upsert the effect, log the try.
PG_EFFECT = """
WITH ok AS (
    SELECT id FROM tether_jobs
    WHERE id = %(job)s AND lease_token = %(token)s AND state = 'running'
    FOR SHARE
), eff AS (
    INSERT INTO fault_effects (job_id, lease_token, attempt, pid, at)
    SELECT %(job)s, %(token)s, %(attempt)s, %(pid)s,
           extract(epoch FROM clock_timestamp()) FROM ok
    ON CONFLICT (job_id) DO UPDATE SET lease_token = excluded.lease_token,
        attempt = excluded.attempt, pid = excluded.pid, at = excluded.at,
        writes = fault_effects.writes + 1
    RETURNING job_id
)
INSERT INTO fault_effect_log (job_id, lease_token, pid, accepted, at)
SELECT %(job)s, %(token)s, %(pid)s, EXISTS (SELECT 1 FROM eff),
       extract(epoch FROM clock_timestamp())
RETURNING accepted
"""


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


_local = threading.local()


def sqlite_effect(path: str, job: int, token: int, attempt: int, pid: int) -> bool:
    """The fenced effect on SQLite (blocking: run it in a thread)."""
    conn: sqlite3.Connection | None = getattr(_local, "conn", None)
    if conn is None:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=30000")
        _local.conn = conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        ok = (
            conn.execute(
                "SELECT 1 FROM tether_jobs WHERE id = ? AND lease_token = ? AND state = 'running'",
                (job, token),
            ).fetchone()
            is not None
        )
        now = time.time()
        if ok:
            conn.execute(
                "INSERT INTO fault_effects (job_id, lease_token, attempt, pid, at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET "
                "lease_token = excluded.lease_token, attempt = excluded.attempt, "
                "pid = excluded.pid, at = excluded.at, writes = fault_effects.writes + 1",
                (job, token, attempt, pid, now),
            )
        conn.execute(
            "INSERT INTO fault_effect_log (job_id, lease_token, pid, accepted, at) "
            "VALUES (?, ?, ?, ?, ?)",
            (job, token, pid, int(ok), now),
        )
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return ok


def pg_effect_sync(url: str, job: int, token: int, attempt: int, pid: int) -> bool:
    """The fenced effect on PostgreSQL from a thread (its own connection each time)."""
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row: Any = conn.execute(
            PG_EFFECT, {"job": job, "token": token, "attempt": attempt, "pid": pid}
        ).fetchone()
        return bool(row[0])
