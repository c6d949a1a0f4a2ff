"""A job's own log (see :mod:`tether.store.common.logs`)."""

# The leases of the jobs whose lines are written, checked in the writing transaction.
# A key-share lock conflicts with neither a heartbeat, a finish nor a rescue (no-key
# updates), so a busy log never holds them up. Held to the commit, it keeps a row from
# being deleted before its lines are in, so that a deleted job's lines are deleted with
# it. It would wait only for a delete of a row (a person's, retention's pick) or an
# operator's full lock: those rows are skipped, and BUSY tells them from lost leases.
FENCE = """
SELECT j.id, j.attempt FROM tether_jobs j
JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS v(id, token) ON v.id = j.id
WHERE j.lease_token = v.token AND j.state = 'running'
FOR KEY SHARE OF j SKIP LOCKED
"""
# The same jobs, unlocked: those FENCE skipped that still run under the token are held
# by someone else (their writer tries again), not lost.
BUSY = """
SELECT j.id FROM tether_jobs j
JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS v(id, token) ON v.id = j.id
WHERE j.lease_token = v.token AND j.state = 'running'
"""

# What each job's log holds: its lines, their bytes, the last seq, and the seq of the
# 'dropped' row if it is full. One range of the primary key per job, at most
# job_log_max_lines + 1 rows.
TALLY = """
SELECT job_id, COUNT(*) AS lines, COALESCE(SUM(octet_length(message)), 0) AS size,
       MAX(seq) AS last, MAX(CASE WHEN level = 'dropped' THEN seq END) AS marker
FROM tether_job_logs WHERE job_id = ANY(%(ids)s::bigint[]) GROUP BY job_id
"""

# The lines as one array per column (SQLite's take one array of rows: LINE_ROWS).
LINE_ROWS = False
APPEND = """
INSERT INTO tether_job_logs (job_id, seq, attempt, at, level, message)
SELECT s.job_id, s.seq, s.attempt, to_timestamp(s.at), s.level, s.message
FROM unnest(%(job_ids)s::bigint[], %(seqs)s::int[], %(attempts)s::int[], %(ats)s::float8[],
            %(levels)s::text[], %(messages)s::text[])
    AS s(job_id, seq, attempt, at, level, message)
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
