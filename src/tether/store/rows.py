"""Turning database rows into tether records; shared by both stores."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tether import payload
from tether.job import (
    ArtifactInfo,
    CancellationRow,
    Job,
    JobEvent,
    LimitInfo,
    StepInfo,
    WorkerInfo,
)
from tether.procinfo import PidSpace, WorkerProcess
from tether.states import JobState

Row = Mapping[str, Any]

JOB_COLUMNS = (
    "id, task, args, queue, priority, key, state, attempt, max_attempts, timeout, run_at, "
    "created_at, started_at, finished_at, worker_id, lease_token, lease_expires_at, "
    "heartbeat_at, cancel_requested_at, cancel_reason, cancel_force, checkpoint, "
    "progress_current, progress_total, result, error, owner, idempotency_key, "
    "pause_requested_at, pause_reason, budget, usage, limits, stopped_by, "
    "parent_id, phase, waiting_children, cancel_cascade, meta"
)


def worker_process(row: Row) -> WorkerProcess:
    """A :class:`WorkerProcess` from a ``tether_workers`` row's process columns."""
    return WorkerProcess(
        pid=row["pid"],
        pid_start=row["pid_start"],
        space=PidSpace(boot_id=row["boot_id"], pid_ns=row["pid_ns"], machine_id=row["machine_id"]),
    )


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job))
# Positions in JOB_COLUMNS (and Job's fields) of the columns a dialect may store in
# another form: times, JSON payloads, flags.
_TIME_AT = (10, 11, 12, 13, 16, 17, 18, 28)
_JSON_AT = (2, 21, 24, 38)
_FLAG_AT = (20, 36, 37)
_STATE_AT, _KEY_AT, _LIMITS_AT = 6, 27, 32


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
        # Lists are JSON text in SQLite and arrays in PostgreSQL.
        self._list: Callable[[Any], Any] = _loads if text_json else _identity
        self._time: Callable[[Any], datetime | None] = epoch_to_dt if epoch_times else _identity
        # The driver hands out times, JSON and flags as tether keeps them (PostgreSQL).
        self._native = not text_json and not epoch_times
        self._text_json = text_json

    def json_text(self, value: Any) -> str | None:
        """A JSON column as JSON text (PostgreSQL's driver hands it over decoded)."""
        if value is None or self._text_json:
            return None if value is None else str(value)
        return json.dumps(value, separators=(",", ":"))

    def time(self, value: Any) -> datetime | None:
        """A time column as tether hands it out: an aware UTC datetime, or ``None``."""
        return self._time(value)

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
            idempotency_key=payload.unscoped_key(row["idempotency_key"]),
            pause_requested_at=t(row["pause_requested_at"]),
            pause_reason=row["pause_reason"],
            budget=row["budget"],
            usage=row["usage"],
            limits=tuple(self._list(row["limits"]) or ()),
            stopped_by=row["stopped_by"],
            parent_id=row["parent_id"],
            phase=row["phase"],
            waiting_children=bool(row["waiting_children"]),
            cancel_cascade=bool(row["cancel_cascade"]),
            meta=self._json(row["meta"]),
        )

    def job_from_tuple(self, row: Sequence[Any]) -> Job:
        """The same :class:`Job` as :meth:`job`, from a tuple of :data:`JOB_COLUMNS`:
        looking columns up by name costs most of a claim's Python time on SQLite."""
        values = list(row)
        if not self._native:  # a claim's hot path on PostgreSQL skips these
            t, j = self._time, self._json
            for i in _TIME_AT:
                values[i] = t(values[i])
            for i in _JSON_AT:
                values[i] = j(values[i])
            for i in _FLAG_AT:
                values[i] = bool(values[i])
        values[_STATE_AT] = JobState(values[_STATE_AT])
        values[_KEY_AT] = payload.unscoped_key(values[_KEY_AT])
        values[_LIMITS_AT] = tuple(self._list(values[_LIMITS_AT]) or ())
        job = object.__new__(Job)
        job.__dict__.update(zip(_JOB_FIELDS, values, strict=True))
        return job

    def event(self, row: Row) -> JobEvent:
        """A :class:`JobEvent` from a ``tether_job_events`` or ``tether_job_history`` row."""
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
            abandoned_threads=row["abandoned_threads"],
            thread_pool_full=bool(row["thread_pool_full"]),
            queues=tuple(q for q in row["queues"].split(",") if q),
            tasks=tuple(json.loads(row["tasks"])) if row["tasks"] is not None else None,
        )

    def limit(self, row: Row) -> LimitInfo:
        """A :class:`LimitInfo` from a ``tether_limits`` row (plus ``queued``)."""
        return LimitInfo(
            name=row["name"],
            kind=row["kind"],
            capacity=row["capacity"],
            used=row["used"],
            held=row["held"],
            block_on_hold=bool(row["block_on_hold"]),
            queued=row["queued"],
        )

    def artifact(self, row: Row) -> ArtifactInfo:
        """An :class:`ArtifactInfo` from a ``tether_artifacts`` row."""
        created = self._time(row["created_at"])
        assert created is not None
        return ArtifactInfo(row["job_id"], row["name"], row["size"], created)

    def step(self, row: Row) -> StepInfo:
        """A :class:`StepInfo` from a ``tether_steps`` row."""
        started = self._time(row["started_at"])
        assert started is not None
        return StepInfo(
            job_id=row["job_id"],
            name=row["name"],
            kind=row["kind"],
            state=row["state"],
            result=self._json(row["result"]),
            attempt=row["attempt"],
            started_at=started,
            finished_at=self._time(row["finished_at"]),
            wakes_at=self._time(row["wakes_at"]),
            usage=int(row["usage"]),
        )

    def cancellation(self, row: Row) -> CancellationRow:
        """A :class:`CancellationRow` from a ``tether_cancellations`` row."""
        initiated = self._time(row["initiated_at"])
        assert initiated is not None
        return CancellationRow(
            id=row["id"],
            job_id=row["job_id"],
            request_id=row["request_id"],
            reason=row["reason"],
            force=bool(row["force"]),
            cascade=bool(row["cascade"]),
            initiated_by=row["initiated_by"],
            initiated_at=initiated,
            status=row["status"],
            steps=self._json(row["steps"]) or [],
            result=self._json(row["result"]),
            error=row["error"],
            completed_at=self._time(row["completed_at"]),
        )


# SQL shared by both dialects. A pending cancel wins over anything but success (and a
# job over its budget fails rather than being cancelled); a pending pause turns a
# release or a retry into a pause.
def over_budget(usage: str) -> str:
    """SQL: whether the job has used more than its budget."""
    return f"(budget IS NOT NULL AND {usage} > budget)"


def effective_state(requested: str, usage: str) -> str:
    """SQL for the state an outcome really moves a job to."""
    return (
        f"CASE WHEN cancel_requested_at IS NOT NULL AND {requested} <> 'succeeded' "
        f"THEN CASE WHEN {over_budget(usage)} THEN 'failed' ELSE 'cancelled' END "
        f"WHEN pause_requested_at IS NOT NULL AND {requested} IN ('queued', 'retrying') "
        f"THEN 'paused' ELSE {requested} END"
    )


RESCUE_STATE = (
    "CASE WHEN cancel_requested_at IS NOT NULL "
    f"THEN CASE WHEN {over_budget('usage')} THEN 'failed' ELSE 'cancelled' END "
    "WHEN pause_requested_at IS NOT NULL THEN 'paused' "
    "WHEN attempt >= max_attempts THEN 'failed' ELSE 'retrying' END"
)
"""A crash counts as an attempt; a job with a pending cancel is never revived."""

CANCEL_STATE = (
    "CASE WHEN state = 'running' THEN state "
    f"WHEN state = 'paused' AND {over_budget('usage')} THEN 'failed' ELSE 'cancelled' END"
)
"""What a cancel request does: flag a running job, settle any other at once."""

CANCELLABLE_SQL = "'queued', 'blocked', 'running', 'retrying', 'paused', 'failed'"
