"""Turning database rows into tether records; shared by both stores."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from tether.job import Job, JobEvent, WorkerInfo
from tether.states import JobState

Row = Mapping[str, Any]

JOB_COLUMNS = (
    "id, task, args, queue, priority, key, state, attempt, max_attempts, timeout, run_at, "
    "created_at, started_at, finished_at, worker_id, lease_token, lease_expires_at, "
    "heartbeat_at, cancel_requested_at, cancel_reason, cancel_force, checkpoint, "
    "progress_current, progress_total, result, error, owner, idempotency_key"
)


def epoch_to_dt(value: float | None) -> datetime | None:
    """SQLite keeps Unix seconds; tether hands out aware UTC datetimes."""
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _identity(value: Any) -> Any:
    return value


def _loads(value: Any) -> Any:
    return None if value is None else json.loads(value)


class RowReader:
    """Builds records from rows, given how a dialect stores times and JSON."""

    def __init__(self, *, text_json: bool, epoch_times: bool) -> None:
        self._json: Callable[[Any], Any] = _loads if text_json else _identity
        self._time: Callable[[Any], datetime | None] = epoch_to_dt if epoch_times else _identity

    def job(self, row: Row) -> Job:
        """A :class:`Job` from a ``tether_jobs`` row."""
        t, j = self._time, self._json
        run_at = t(row["run_at"])
        created_at = t(row["created_at"])
        assert run_at is not None and created_at is not None
        return Job(
            id=row["id"],
            task=row["task"],
            args=j(row["args"]),
            queue=row["queue"],
            priority=row["priority"],
            key=row["key"],
            state=JobState(row["state"]),
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            timeout=row["timeout"],
            run_at=run_at,
            created_at=created_at,
            started_at=t(row["started_at"]),
            finished_at=t(row["finished_at"]),
            worker_id=row["worker_id"],
            lease_token=row["lease_token"],
            lease_expires_at=t(row["lease_expires_at"]),
            heartbeat_at=t(row["heartbeat_at"]),
            cancel_requested_at=t(row["cancel_requested_at"]),
            cancel_reason=row["cancel_reason"],
            cancel_force=bool(row["cancel_force"]),
            checkpoint=j(row["checkpoint"]),
            progress_current=row["progress_current"],
            progress_total=row["progress_total"],
            result=j(row["result"]),
            error=row["error"],
            owner=row["owner"],
            idempotency_key=row["idempotency_key"],
        )

    def event(self, row: Row) -> JobEvent:
        """A :class:`JobEvent` from a ``tether_job_events`` row."""
        at = self._time(row["at"])
        assert at is not None
        return JobEvent(
            id=row["id"],
            job_id=row["job_id"],
            from_state=JobState(row["from_state"]) if row["from_state"] else None,
            to_state=JobState(row["to_state"]),
            at=at,
            worker_id=row["worker_id"],
            actor=row["actor"],
            reason=row["reason"],
        )

    def worker(self, row: Row) -> WorkerInfo:
        """A :class:`WorkerInfo` from a ``tether_workers`` row plus ``running_jobs``."""
        started, beat = self._time(row["started_at"]), self._time(row["heartbeat_at"])
        assert started is not None and beat is not None
        return WorkerInfo(
            id=row["id"],
            name=row["name"],
            host=row["host"],
            pid=row["pid"],
            started_at=started,
            heartbeat_at=beat,
            state=row["state"],
            running_jobs=row["running_jobs"],
        )


# SQL shared by both dialects: the outcome a worker reports, adjusted in the database so
# that a pending cancel always wins over a failure, a retry or a release.
def effective_state(requested: str) -> str:
    """SQL for the state an outcome really moves a job to."""
    return (
        f"CASE WHEN {requested} IN ('failed', 'retrying', 'queued') "
        f"AND cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE {requested} END"
    )


RESCUE_STATE = (
    "CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' "
    "WHEN attempt >= max_attempts THEN 'failed' ELSE 'retrying' END"
)
"""A crash counts as an attempt; a job with a pending cancel is never revived."""
