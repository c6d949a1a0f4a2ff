"""A job's own log (see :mod:`tether.store.common.logs`)."""

# The lease of the job whose lines are written, checked in the writing transaction. A
# key-share lock conflicts with neither a heartbeat, a finish nor a rescue (no-key
# updates), so a busy log never holds them up; it waits only for a delete of the row
# (a person's, retention's pick) or an operator's full lock, and that wait is bounded
# (SqlBase._transact_bounded). Held to the commit, it keeps the row from being deleted
# before the lines are in, so that a deleted job's lines are deleted with it.
FENCE = """
SELECT attempt FROM tether_jobs
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
FOR KEY SHARE  -- waits, bounded (SqlBase._transact_bounded): a delete must not pass it
"""

# What the job's log holds: its lines, their bytes, the last seq, and the count of
# dropped lines (the 'dropped' row's message) if it is full. One range of the primary
# key, at most job_log_max_lines + 1 rows.
TALLY = """
SELECT COUNT(*) AS lines, COALESCE(SUM(octet_length(message)), 0) AS size,
       COALESCE(MAX(seq), 0) AS last,
       MAX(CASE WHEN level = 'dropped' THEN seq END) AS marker
FROM tether_job_logs WHERE job_id = %(id)s
"""

APPEND = """
INSERT INTO tether_job_logs (job_id, seq, attempt, at, level, message)
SELECT %(id)s, s.seq, %(attempt)s, to_timestamp(s.at), s.level, s.message
FROM unnest(%(seqs)s::int[], %(ats)s::float8[], %(levels)s::text[], %(messages)s::text[])
    AS s(seq, at, level, message)
"""

# The row that counts what a full log dropped: made once, then its count grows.
DROPPED = """
INSERT INTO tether_job_logs (job_id, seq, attempt, at, level, message)
VALUES (%(id)s, %(seq)s, %(attempt)s, to_timestamp(%(at)s), 'dropped', %(count)s::text)
ON CONFLICT (job_id, seq) DO UPDATE
SET message = (tether_job_logs.message::bigint + %(count)s)::text, at = excluded.at,
    attempt = excluded.attempt
"""

LINES = """
SELECT job_id, seq, attempt, at, level, message FROM tether_job_logs
WHERE job_id = %(id)s AND seq > %(after)s ORDER BY seq LIMIT %(limit)s
"""
