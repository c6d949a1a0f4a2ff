"""A job's own log (see :mod:`tether.store.common.logs`)."""

# No row locks: the write lock the transaction holds lets nothing change meanwhile.
FENCE = (
    "SELECT attempt FROM tether_jobs WHERE id = :id AND lease_token = :token AND state = 'running'"
)

# See the PostgreSQL text; bytes are those of the message's UTF-8 text.
TALLY = (
    "SELECT COUNT(*) AS lines, COALESCE(SUM(length(CAST(message AS BLOB))), 0) AS size, "
    "COALESCE(MAX(seq), 0) AS last, MAX(CASE WHEN level = 'dropped' THEN seq END) AS marker "
    "FROM tether_job_logs WHERE job_id = :id"
)

APPEND = (
    "INSERT INTO tether_job_logs (job_id, seq, attempt, at, level, message) "
    "SELECT :id, s.value, :attempt, a.value, l.value, m.value FROM json_each(:seqs) s "
    "JOIN json_each(:ats) a ON a.key = s.key JOIN json_each(:levels) l ON l.key = s.key "
    "JOIN json_each(:messages) m ON m.key = s.key"
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
