"""Durable steps, sleeps and signals (see :mod:`tether.store.common.steps`)."""

STEPS = """
SELECT job_id, name, kind, state, result, attempt, started_at, finished_at, wakes_at, usage
FROM tether_steps WHERE job_id = %(id)s ORDER BY seq
"""
STEP = """
SELECT job_id, name, kind, state, result, attempt, started_at, finished_at, wakes_at, usage,
       EXTRACT(EPOCH FROM wakes_at - now())::float8 AS left_s
FROM tether_steps WHERE job_id = %(id)s AND name = %(name)s
"""

# A step's row, written under the job's lease: nothing is written unless the job is
# running under this token. A row a sleep or a wait left 'waiting' becomes this one; a
# row already 'done' stays as it is (0 rows).
SAVE_STEP = """
INSERT INTO tether_steps (job_id, name, kind, state, result, attempt, started_at,
                          finished_at, wakes_at, usage)
SELECT %(id)s, %(name)s, %(kind)s, %(state)s, %(result)s::jsonb, j.attempt,
       now() - make_interval(secs => %(took)s::float8),
       CASE WHEN %(state)s = 'waiting' THEN NULL ELSE now() END,
       CASE WHEN %(wait)s::float8 IS NULL THEN NULL
            ELSE now() + make_interval(secs => %(wait)s::float8) END,
       %(usage)s
FROM tether_jobs j WHERE j.id = %(id)s AND j.lease_token = %(token)s AND j.state = 'running'
ON CONFLICT (job_id, name) DO UPDATE SET state = excluded.state, result = excluded.result,
    attempt = excluded.attempt, finished_at = excluded.finished_at,
    usage = tether_steps.usage + excluded.usage
WHERE tether_steps.state <> 'done'
"""

# The job's own row, locked by the attempt that holds its lease before it decides to
# sleep or wait: a signal takes the same lock (LOCK_JOB) before it is stored, so either
# the signal is in before the look that follows, or it comes after the job is parked
# and wakes it. Its holder is the job's worker, or a signal or a rescue that holds it
# for milliseconds.
LOCK_OWN_JOB = """
SELECT 1 FROM tether_jobs
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
FOR NO KEY UPDATE  -- waits, bounded (SqlBase._transact_bounded): skipping may lose a signal
"""
LOCK_JOB = """
SELECT state FROM tether_jobs WHERE id = %(id)s
FOR NO KEY UPDATE  -- waits, bounded (SqlBase._transact_bounded): skipping may lose a wake-up
"""

SIGNAL = "SELECT payload FROM tether_signals WHERE job_id = %(id)s AND name = %(name)s"
SEND_SIGNAL = """
INSERT INTO tether_signals (job_id, name, payload, sent_by)
VALUES (%(id)s, %(name)s, %(payload)s::jsonb, %(actor)s)
ON CONFLICT (job_id, name) DO NOTHING
"""
# Whether a signal sent again carries the same payload: jsonb compares JSON values (key
# order and spacing aside), so `stored` is not needed here.
SAME_SIGNAL = """
SELECT payload IS NOT DISTINCT FROM %(payload)s::jsonb AS same, NULL::text AS stored
FROM tether_signals WHERE job_id = %(id)s AND name = %(name)s
"""
# A parked job that waits for this signal runs at once (or, paused, as soon as it is
# resumed); one whose wait has not come yet finds the signal when it does.
WAKE = """
UPDATE tether_jobs SET run_at = LEAST(run_at, now())
WHERE id = %(id)s AND state IN ('queued', 'retrying', 'paused')
  AND EXISTS (SELECT 1 FROM tether_steps s WHERE s.job_id = %(id)s AND s.name = %(step)s
              AND s.state = 'waiting')
RETURNING queue
"""

# The lease check of a handler's fenced transaction (ctx.transaction()), in that
# transaction: the share lock holds the lease's row until it commits, so a rescue
# waits for the commit, and a transaction whose lease was lost meanwhile commits
# nothing.
FENCE = """
SELECT 1 FROM tether_jobs
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
FOR SHARE  -- waits, bounded (SqlBase._transact_bounded): must see a rescue in flight
"""

# save_step in one round trip (see tether_save_step, migration 0030).
SAVE_STEP_AT_ONCE = """
SELECT tether_save_step(%(id)s, %(token)s, %(name)s, %(result)s::jsonb, %(took)s::float8,
                        %(usage)s) AS code
"""
