"""Claims, heartbeats, checkpoints, outcomes and artifacts (see
:mod:`tether.store.common.leases`)."""

import json
from collections.abc import Sequence

from tether.job import Beat, Outcome
from tether.store.rows import JOB_COLUMNS, effective_state
from tether.store.sql.postgres.fragments import TERMINAL_SQL

# Limit admission (concurrency limits, rate buckets) happens inside the PL/pgSQL
# function tether_claim_paced (migrations 0020 and 0022): PostgreSQL's claimers run
# concurrently, so it must be done in the database, under the buckets' row locks, in
# this one round trip. SQLite's claim does the same walk in Python under its write lock
# (tether.store.admission, which says why there are two); a change to one is a change
# to the other.
CLAIM = f"""
SELECT {JOB_COLUMNS}
FROM tether_claim_paced(%(worker)s, %(queues)s, %(tasks)s, %(limit)s, %(lease)s)
"""


def beats(part: Sequence[Beat]) -> str:
    """HEARTBEAT's ``beats`` parameter: objects, as ``jsonb_to_recordset`` reads them."""
    return json.dumps(
        [
            {
                "id": b.job_id,
                "token": b.lease_token,
                "cur": b.progress_current,
                "tot": b.progress_total,
                "usage": b.usage,
            }
            for b in part
        ]
    )


# One statement, the worker's own row included (so HEARTBEAT_WORKER is None). It waits
# on no row lock: any client may hold a job row or the worker's row for as long as it
# likes (a caller's transaction that enqueues a dependent, an operator in psql), and a
# heartbeat stuck behind one would make the worker fence every job it runs. A row held
# by someone else is skipped: the lease of a skipped job is not extended this round,
# and the job is reported "held" (still ours) or lost, from a plain read of the row,
# which waits for nobody. A held job is safe: it is rescued only if its worker's beat
# counter also stands still (see RESCUE). It takes the no-key-update lock, the one the
# UPDATE itself takes, so that a key-share holder (a foreign-key check) causes no skip.
#
# Rows come back as (kind, id, cancel, force, pause): kind 'kept' (lease extended),
# 'held' (skipped, still ours), and one row of kind 'worker', 'worker held' or
# 'worker gone' for the worker's row (its beat counted, skipped, or no such row).
HEARTBEAT = """
WITH v AS (
    SELECT * FROM jsonb_to_recordset(%(beats)s::jsonb)
        AS v(id bigint, token bigint, cur bigint, tot bigint, usage bigint)
), wl AS (
    -- An older beat delivered late (a call the worker gave up on) leaves the row to
    -- the newer one's: its `holding` is out of date (see 0023).
    SELECT id FROM tether_workers WHERE id = %(worker)s
        AND (%(seq)s::bigint IS NULL OR beat_seq < %(seq)s::bigint)
    FOR NO KEY UPDATE SKIP LOCKED
), w AS (
    -- A worker presumed dead (its session was gone for a while) that still beats is
    -- alive: its old leases were revoked by the rescue, its new ones must not be. Every
    -- beat that lands adds one to the counter the rescuers watch.
    UPDATE tether_workers SET heartbeat_at = now(), beat_before = heartbeat_at,
        beats = beats + 1, lease = %(lease)s, holding = %(holding)s::bigint[],
        beat_seq = COALESCE(%(seq)s::bigint, beat_seq),
        state = CASE WHEN state = 'dead' THEN 'active' ELSE state END
    WHERE id IN (SELECT id FROM wl)
    RETURNING id
), locked AS (
    -- In id order, as the rescuer takes them. (A worker's completions and its heartbeat
    -- never share rows: it does not beat for the jobs whose outcome it is writing.) The
    -- no-key-update lock, the UPDATE's own mode: an enqueue's key-share lock on an
    -- upstream job does not hold the beat.
    SELECT j.id FROM tether_jobs j WHERE j.id = ANY(%(ids)s::bigint[])
    ORDER BY j.id FOR NO KEY UPDATE OF j SKIP LOCKED
), u AS (
    -- The ids also come as an array, which the planner can size: the rows are looked up
    -- by key, where a join with the JSON rows would read every running job at every beat.
    UPDATE tether_jobs j SET lease_expires_at = now() + make_interval(secs => %(lease)s),
        heartbeat_at = now(),
        progress_current = COALESCE(v.cur, j.progress_current),
        progress_total = COALESCE(v.tot, j.progress_total),
        usage = COALESCE(v.usage, j.usage)
    FROM v JOIN locked ON locked.id = v.id
    WHERE j.id = v.id AND j.id = ANY(%(ids)s::bigint[]) AND j.lease_token = v.token
      -- Written so that no partial index of running jobs matches it: the planner may
      -- read a whole one (every running job) rather than look these rows up by key.
      AND (j.state = 'running') IS TRUE
    RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel, j.cancel_force,
              j.pause_requested_at IS NOT NULL AS pause
)
SELECT 'kept' AS kind, id, cancel, cancel_force, pause FROM u
UNION ALL
-- The skipped rows, read without a lock (the statement's snapshot): still ours unless
-- the token or the state moved on.
SELECT 'held', j.id, j.cancel_requested_at IS NOT NULL, j.cancel_force,
       j.pause_requested_at IS NOT NULL
FROM tether_jobs j JOIN v ON v.id = j.id
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id NOT IN (SELECT id FROM locked)
  AND j.lease_token = v.token AND (j.state = 'running') IS TRUE
UNION ALL
SELECT CASE WHEN EXISTS (SELECT 1 FROM w) THEN 'worker'
            WHEN EXISTS (SELECT 1 FROM tether_workers WHERE id = %(worker)s)
            THEN 'worker held' ELSE 'worker gone' END,
       NULL, false, false, false
"""
HEARTBEAT_WORKER = None
WORKER_EXISTS = None  # HEARTBEAT itself says worker, worker held or worker gone

SAVE_CHECKPOINT = """
UPDATE tether_jobs SET checkpoint = %(checkpoint)s::jsonb
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
"""

# A finish goes in batches of this many outcomes, each its own statement: 300 ids of up
# to 19 digits, comma-joined, fit in the one NOTIFY payload the transition trigger sends.
FINISH_BATCH = 300


def outcomes(part: Sequence[Outcome]) -> str:
    """FINISH's ``outcomes`` parameter: objects, as ``json_to_recordset`` reads them."""
    return json.dumps(
        [
            {
                "id": o.job_id,
                "token": o.lease_token,
                "state": o.state.value,
                "result": o.result_json,
                "error": o.error,
                "delay": o.delay,
                "reason": o.reason,
                "usage": o.usage,
                "stopped_by": o.stopped_by,
                "phase": o.phase,
                "cur": o.progress_current,
                "tot": o.progress_total,
            }
            for o in part
        ]
    )


_EFF = effective_state("v.state", "COALESCE(v.usage, j.usage)")
# One fenced statement; the transition trigger sends the notifications. It waits on no
# row lock of its own: a row someone else holds (an update or share lock) is skipped and
# reported "held" (still ours, from a plain read), and the completer tries that outcome
# again next round while its batch-mates are written now. It takes the no-key-update
# lock, the UPDATE's own: a key-share holder (a foreign-key check) causes no skip.
# (The worker's heartbeat leaves these rows alone meanwhile.)
FINISH = f"""
WITH v AS (
    -- The outcomes come as one JSON document (far cheaper for the driver to send than
    -- a dozen arrays); the ids also come as an array, which the planner can size.
    SELECT * FROM json_to_recordset(%(outcomes)s::json)
        AS v(id bigint, token bigint, state text, result text, error text, delay float8,
             reason text, usage bigint, stopped_by text, phase text, cur bigint, tot bigint)
), locked AS (
    -- Looked up by key through v (an array of ids would let the planner scan the whole
    -- table), and in no particular order: a lock that skips never waits, so two such
    -- statements cannot deadlock.
    SELECT j.id FROM v JOIN tether_jobs j ON j.id = v.id
    FOR NO KEY UPDATE OF j SKIP LOCKED
), u AS (
    UPDATE tether_jobs j SET state = {_EFF},
        result = v.result::jsonb,
        error = CASE WHEN v.state = 'succeeded' THEN NULL ELSE COALESCE(v.error, j.error) END,
        -- A release, a pause or the end of a phase does not spend the attempt.
        attempt = CASE WHEN v.state IN ('queued', 'paused', 'blocked') THEN j.attempt - 1
                  ELSE j.attempt END,
        phase = CASE WHEN {_EFF} = 'blocked' THEN v.phase ELSE j.phase END,
        waiting_children = {_EFF} = 'blocked',
        -- A sleep or a wait for a signal (tether.store.common.steps) is a release
        -- with a delay.
        run_at = CASE WHEN v.state = 'retrying' OR (v.state = 'queued' AND v.delay > 0)
                 THEN now() + make_interval(secs => v.delay)
                 WHEN v.state = 'queued' AND j.checkpoint IS NOT NULL
                 THEN LEAST(j.run_at, j.created_at)
                 ELSE j.run_at END,
        finished_at = CASE WHEN {_EFF} IN ({TERMINAL_SQL}) THEN now() ELSE NULL END,
        lease_expires_at = NULL, actor = %(worker)s, usage = COALESCE(v.usage, j.usage),
        progress_current = COALESCE(v.cur, j.progress_current),
        progress_total = COALESCE(v.tot, j.progress_total),
        stopped_by = v.stopped_by,
        pause_requested_at = CASE WHEN {_EFF} IN ('paused', 'blocked')
                             THEN j.pause_requested_at END,
        pause_reason = CASE WHEN {_EFF} = 'paused' THEN COALESCE(j.pause_reason, v.reason)
                       ELSE j.pause_reason END,
        reason = CASE WHEN {_EFF} = 'cancelled'
                      THEN COALESCE(j.cancel_reason, v.reason, 'cancel requested')
                      WHEN {_EFF} = 'paused' THEN COALESCE(j.pause_reason, v.reason)
                      ELSE v.reason END
    FROM v JOIN locked ON locked.id = v.id
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = v.id AND j.lease_token = v.token
      AND j.state = 'running'
    RETURNING j.id, j.state
)
SELECT id, true AS done FROM u
UNION ALL
SELECT j.id, false FROM tether_jobs j JOIN v ON v.id = j.id
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id NOT IN (SELECT id FROM locked)
  AND j.lease_token = v.token AND j.state = 'running'
"""

SAVE_ARTIFACT = """
INSERT INTO tether_artifacts (job_id, name, size, data)
SELECT %(id)s, %(name)s, %(size)s, %(data)s WHERE EXISTS (SELECT 1 FROM tether_jobs
    WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running')
ON CONFLICT (job_id, name) DO UPDATE SET size = excluded.size, data = excluded.data,
    created_at = now()
"""

# The fence of an INSERT-based worker write (spawn, artifact), run after the INSERT in
# its transaction. The INSERT's own lease test reads the snapshot of its start, and the
# INSERT may then wait on a unique key held by another transaction; a rescue committed
# meanwhile would go unseen. A share lock reads the newest row version (waiting for a
# rescue in flight) and holds it until commit, so the write counts only if the lease
# still holds when it commits. Locking after the INSERT, not before, keeps a write stuck
# on a key from holding up the rescuer. It must wait (a rescue in flight holds the row
# for milliseconds, and skipping would let a stale write count), so it is bounded:
# spawn and save_artifact run under SqlBase._transact_bounded (lock_timeout, then
# RowLocked).
LEASE_HELD = """
SELECT 1 FROM tether_jobs
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
  AND (NOT %(no_cancel)s OR cancel_requested_at IS NULL)
FOR SHARE  -- waits, bounded: run only under SqlBase._transact_bounded (see above)
"""

LIST_ARTIFACTS = """
SELECT job_id, name, size, created_at FROM tether_artifacts WHERE job_id = %(id)s ORDER BY name
"""
GET_ARTIFACT = "SELECT data FROM tether_artifacts WHERE job_id = %(id)s AND name = %(name)s"
