"""Cancellation records (see :mod:`tether.store.common.cancellations`)."""

from tether.store.sql.sqlite.fragments import NOW

CREATE_CANCELLATION = (
    "INSERT INTO tether_cancellations (id, job_id, request_id, reason, force, "
    "cascade, initiated_by, initiated_at, status) VALUES (:id, :job_id, :request_id, :reason, "
    f":force, :cascade, :initiated_by, {NOW}, 'initiated') ON CONFLICT DO NOTHING"
)
# The record just created, or the one that took its place (same job or same request).
CANCELLATION_FOR = (
    "SELECT * FROM tether_cancellations WHERE job_id = :job_id OR "
    "(:request_id IS NOT NULL AND request_id = :request_id) ORDER BY id = :id DESC, "
    "status NOT IN ('completed', 'partial', 'failed') DESC, "
    "initiated_at DESC LIMIT 1"
)
UPDATE_CANCELLATION = (
    "UPDATE tether_cancellations SET status = :status, steps = :steps, "
    "result = COALESCE(:result, result), error = :error, "
    f"completed_at = CASE WHEN :final THEN {NOW} ELSE completed_at END "
    "WHERE id = :id AND (:expect IS NULL OR status = :expect) RETURNING job_id"
)
GET_CANCELLATION = (
    "SELECT * FROM tether_cancellations WHERE job_id = :job_id OR "
    "(:request_id IS NOT NULL AND request_id = :request_id) ORDER BY initiated_at DESC LIMIT 1"
)
# Two statements, not one with an OR: the filtered one uses the partial index.
LIST_CANCELLATIONS = (
    "SELECT * FROM tether_cancellations ORDER BY initiated_at DESC, id LIMIT :limit OFFSET :offset"
)


def list_cancellations_with_status(status: str) -> str:
    """Those of status ``status`` (the parameter ``status``), by the partial index."""
    return (
        "SELECT * FROM tether_cancellations WHERE status = :status "
        "ORDER BY initiated_at DESC, id LIMIT :limit OFFSET :offset"
    )


LIST_STALE_CANCELLATIONS = (
    "SELECT * FROM tether_cancellations "
    "WHERE status NOT IN ('completed', 'partial', 'failed') "
    f"AND initiated_at <= {NOW} - :older_than ORDER BY initiated_at, id LIMIT :limit"
)
