"""Cancellation records (see :mod:`tether.store.common.cancellations`)."""

from psycopg import sql

CREATE_CANCELLATION = (
    "INSERT INTO tether_cancellations (id, job_id, request_id, reason, force, "
    "cascade, initiated_by, status) VALUES (%(id)s, %(job_id)s, %(request_id)s, %(reason)s, "
    "%(force)s, %(cascade)s, %(initiated_by)s, 'initiated') ON CONFLICT DO NOTHING"
)
# The record just created, or the one that took its place (same job or same request).
CANCELLATION_FOR = (
    "SELECT * FROM tether_cancellations WHERE job_id = %(job_id)s OR "
    "(%(request_id)s::text IS NOT NULL AND request_id = %(request_id)s) "
    "ORDER BY id = %(id)s DESC, status NOT IN ('completed', 'partial', 'failed') DESC, "
    "initiated_at DESC LIMIT 1"
)
UPDATE_CANCELLATION = (
    "UPDATE tether_cancellations SET status = %(status)s, steps = %(steps)s::jsonb, "
    "result = COALESCE(%(result)s::jsonb, result), error = %(error)s, "
    "completed_at = CASE WHEN %(final)s THEN now() ELSE completed_at END "
    "WHERE id = %(id)s AND (%(expect)s::text IS NULL OR status = %(expect)s) RETURNING job_id"
)
GET_CANCELLATION = (
    "SELECT * FROM tether_cancellations WHERE job_id = %(job_id)s OR "
    "(%(request_id)s::text IS NOT NULL AND request_id = %(request_id)s) "
    "ORDER BY initiated_at DESC LIMIT 1"
)
# Two statements, not one with an OR: the filtered one uses the partial index.
LIST_CANCELLATIONS = (
    "SELECT * FROM tether_cancellations ORDER BY initiated_at DESC, id "
    "LIMIT %(limit)s OFFSET %(offset)s"
)


def list_cancellations_with_status(status: str) -> str:
    """Those of status ``status``, by the partial index. The status is a literal, not a
    parameter, so that even a prepared plan knows it may use the index."""
    return (
        sql.SQL(
            "SELECT * FROM tether_cancellations WHERE status = {} "
            "ORDER BY initiated_at DESC, id LIMIT %(limit)s OFFSET %(offset)s"
        )
        .format(sql.Literal(status))
        .as_string()
    )


LIST_STALE_CANCELLATIONS = (
    "SELECT * FROM tether_cancellations "
    "WHERE status NOT IN ('completed', 'partial', 'failed') "
    "AND initiated_at <= now() - make_interval(secs => %(older_than)s) "
    "ORDER BY initiated_at, id LIMIT %(limit)s"
)
