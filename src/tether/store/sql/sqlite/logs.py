"""A job's own log (see :mod:`tether.store.common.logs`)."""

from tether.store.sql.sqlite.fragments import each

# No row locks: the write lock the transaction holds lets nothing change meanwhile.
FENCE = (
    "SELECT j.id, j.attempt FROM tether_jobs j JOIN (SELECT a.value AS id, b.value AS token "
    "FROM json_each(:ids) a JOIN json_each(:tokens) b ON b.key = a.key) v ON v.id = j.id "
    "WHERE j.lease_token = v.token AND j.state = 'running'"
)
# Nothing is ever skipped: no row is held.
BUSY = None

# See the PostgreSQL text; bytes are those of the message's UTF-8 text.
TALLY = (
    "SELECT job_id, COUNT(*) AS lines, COALESCE(SUM(length(CAST(message AS BLOB))), 0) "
    "AS size, MAX(seq) AS last, MAX(CASE WHEN level = 'dropped' THEN seq END) AS marker "
    f"FROM tether_job_logs WHERE job_id IN {each('ids')} GROUP BY job_id"
)

# The lines as one JSON array of [job_id, seq, attempt, at, level, message] rows (see
# LINE_ROWS): one pass over it, where a join of one array per column on their keys would
# cost the square of the lines.
LINE_ROWS = True
APPEND = (
    "INSERT INTO tether_job_logs (job_id, seq, attempt, at, level, message) "
    "SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5 "
    "FROM json_each(:rows)"
)

DROPPED = (
    "INSERT INTO tether_job_logs (job_id, seq, attempt, at, level, message) "
    "VALUES (:id, :seq, :attempt, :at, 'dropped', CAST(:count AS TEXT)) "
    "ON CONFLICT (job_id, seq) DO UPDATE "
    "SET message = CAST(CAST(tether_job_logs.message AS INTEGER) + :count AS TEXT), "
    "at = excluded.at, attempt = excluded.attempt"
)

LINES = (
    "SELECT job_id, seq, attempt, at, level, message FROM tether_job_logs "
    "WHERE job_id = :id AND seq > :after ORDER BY seq LIMIT :limit"
)
