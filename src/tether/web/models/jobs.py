"""The bodies of the job routes (:mod:`tether.web.routes.jobs`): enqueue, read, list,
history, and the actions on one job, cancellation included."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from tether import payload
from tether.cancellation import CancellationRecord, CancellationResult, CancellationStep
from tether.job import Job, JobEvent, StepInfo
from tether.joblog import LogLine
from tether.states import JobState
from tether.web.models.common import MAX_ID, MAX_INT, JobId, Name, SafeName, Text, _In


class EnqueueIn(_In):
    """A job to enqueue. A known ``idempotency_key`` returns the job made with it."""

    task: SafeName
    args: dict[str, Any] = Field(default_factory=dict)
    queue: SafeName | None = None
    priority: int | None = Field(default=None, ge=-MAX_INT, le=MAX_INT)
    key: SafeName | None = Field(default=None, description="Concurrency key.")
    delay: float = Field(default=0.0, ge=0, le=366 * 86400, description="Seconds.")
    max_attempts: int | None = Field(default=None, ge=1, le=1000)
    timeout: float | None = Field(default=None, gt=0, le=366 * 86400)
    idempotency_key: Name | None = None
    budget: int | None = Field(default=None, ge=1, le=MAX_ID)
    depends_on: list[JobId] = Field(default_factory=list, max_length=1000)
    meta: dict[str, str] | None = Field(
        default=None,
        description="String labels carried with the job: at most 32 keys of 1 to 64 "
        "characters from A-Z a-z 0-9 _ . -, values of at most 512 characters, 4 KiB in all.",
    )


class Lease(BaseModel):
    """Who holds a running job, until when, and its fencing token."""

    worker_id: str | None
    lease_token: int
    expires_at: datetime | None
    heartbeat_at: datetime | None


class CancelRequest(BaseModel):
    """A cancel request on a job (pending while it is running)."""

    requested_at: datetime
    reason: str | None
    force: bool
    cascade: bool


class PauseRequest(BaseModel):
    """A pause request on a running job (it pauses at its next checkpoint)."""

    requested_at: datetime
    reason: str | None


class Progress(BaseModel):
    """What the handler last reported."""

    current: int | None
    total: int | None


class JobOut(BaseModel):
    """A job. ``display_state`` is what people see (``cancelling``, ``pausing``...)."""

    id: int
    task: str
    args: dict[str, Any]
    queue: str
    priority: int
    key: str | None
    state: JobState
    display_state: str
    attempt: int
    max_attempts: int
    timeout: float | None
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    lease: Lease
    cancel_request: CancelRequest | None
    pause_request: PauseRequest | None
    progress: Progress
    checkpoint: Any = None
    result: Any = None
    error: str | None
    owner: str | None
    idempotency_key: str | None
    budget: int | None
    usage: int
    limits: list[str]
    stopped_by: str | None
    parent_id: int | None
    phase: str | None
    waiting_children: bool
    meta: dict[str, str] | None = None

    @classmethod
    def of(cls, job: Job) -> JobOut:
        """The API view of a job."""
        cancel = (
            CancelRequest(
                requested_at=job.cancel_requested_at,
                reason=job.cancel_reason,
                force=job.cancel_force,
                cascade=job.cancel_cascade,
            )
            if job.cancel_requested_at is not None
            else None
        )
        pause = (
            PauseRequest(requested_at=job.pause_requested_at, reason=job.pause_reason)
            if job.pause_requested_at is not None
            else None
        )
        return cls(
            id=job.id,
            task=job.task,
            args=payload.readable(job.args),
            queue=job.queue,
            priority=job.priority,
            key=job.key,
            state=job.state,
            display_state=job.display_state,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            timeout=job.timeout,
            run_at=job.run_at,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            lease=Lease(
                worker_id=job.worker_id,
                lease_token=job.lease_token,
                expires_at=job.lease_expires_at,
                heartbeat_at=job.heartbeat_at,
            ),
            cancel_request=cancel,
            pause_request=pause,
            progress=Progress(current=job.progress_current, total=job.progress_total),
            checkpoint=payload.readable(job.checkpoint),
            result=payload.readable(job.result),
            error=job.error,
            owner=job.owner,
            idempotency_key=job.idempotency_key,
            budget=job.budget,
            usage=job.usage,
            limits=list(job.limits),
            stopped_by=job.stopped_by,
            parent_id=job.parent_id,
            phase=job.phase,
            waiting_children=job.waiting_children,
            meta=job.meta,
        )


class JobRef(BaseModel):
    """A job named in another: its id, task and displayed state."""

    id: int
    task: str
    state: JobState
    display_state: str

    @classmethod
    def of(cls, job: Job) -> JobRef:
        """The short view of a job."""
        return cls(id=job.id, task=job.task, state=job.state, display_state=job.display_state)


class JobDetail(JobOut):
    """A job with its children and its dependency edges."""

    children: list[JobRef]
    depends_on: list[int]
    dependents: list[int]
    unserved: str | None = Field(
        default=None,
        description="Why no live worker can run this waiting job (for example: no worker "
        "serves task X on queue Q); null when one can, or the job is not waiting.",
    )


class JobPage(BaseModel):
    """One page of jobs, newest first; ``next_offset`` is ``None`` on the last page."""

    items: list[JobOut]
    limit: int
    offset: int
    next_offset: int | None


class EventOut(BaseModel):
    """One transition of a job, in database time; ``id`` is null for one read off the
    job's own row (its creation, the claim of its current run, its success)."""

    id: int | None
    job_id: int
    from_state: JobState | None
    to_state: JobState
    at: datetime
    worker_id: str | None
    actor: str | None
    reason: str | None

    @classmethod
    def of(cls, ev: JobEvent) -> EventOut:
        """The API view of an event."""
        return cls(
            id=ev.id,
            job_id=ev.job_id,
            from_state=ev.from_state,
            to_state=ev.to_state,
            at=ev.at,
            worker_id=ev.worker_id,
            actor=ev.actor,
            reason=ev.reason,
        )


class EventList(BaseModel):
    """A job's history, oldest first."""

    items: list[EventOut]


# -- actions -----------------------------------------------------------------------------


class CancelIn(_In):
    """How to cancel. ``wait`` bounds how long the call waits for a running job to stop
    (capped by the server); ``request_id`` makes a retried request share one record."""

    reason: Text | None = None
    force: bool = False
    cascade: bool = True
    wait: float = Field(default=10.0, ge=0, le=3600)
    request_id: Name | None = None


class PauseIn(_In):
    """Why the job is paused."""

    reason: Text | None = None


class ResumeIn(_In):
    """Resume, optionally with a new usage budget."""

    budget: int | None = Field(default=None, ge=1, le=MAX_ID)


class Step(BaseModel):
    """One step of a cancellation."""

    name: str
    status: Literal["completed", "failed", "skipped"]
    started_at: str
    completed_at: str
    details: dict[str, Any]
    error: str | None

    @classmethod
    def of(cls, step: CancellationStep) -> Step:
        """The API view of a step."""
        return cls(
            name=step.name,
            status=step.status,
            started_at=step.started_at,
            completed_at=step.completed_at,
            details=step.details,
            error=step.error,
        )


class CancellationOut(BaseModel):
    """What a cancellation did (see :class:`tether.CancellationResult`)."""

    cancellation_id: str
    job_id: int
    status: str
    outcome: Literal[
        "cancelled", "already_cancelled", "finished_first", "failed_over_budget", "requested"
    ]
    success: bool
    tasks_cancelled: list[int]
    tasks_completed: list[int]
    tasks_failed: list[int]
    runners_terminated: list[str]
    slots_released: list[str]
    artifacts_preserved: list[str]
    dependents_blocked: list[int]
    errors: list[str]
    duration_seconds: float
    steps: list[Step]
    job: JobOut
    hidden_jobs: int = Field(
        default=0, description="Jobs of other principals the cascade reached (not listed)."
    )

    @classmethod
    def of(cls, res: CancellationResult) -> CancellationOut:
        """The API view of a cancellation result."""
        return cls(
            cancellation_id=res.cancellation_id,
            job_id=res.job_id,
            status=res.status,
            outcome=res.outcome,
            success=res.success,
            tasks_cancelled=res.tasks_cancelled,
            tasks_completed=res.tasks_completed,
            tasks_failed=res.tasks_failed,
            runners_terminated=res.runners_terminated,
            slots_released=res.slots_released,
            artifacts_preserved=res.artifacts_preserved,
            dependents_blocked=res.dependents_blocked,
            errors=res.errors,
            duration_seconds=res.duration_seconds,
            steps=[Step.of(s) for s in res.steps],
            job=JobOut.of(res.job),
        )


class CancellationRecordOut(BaseModel):
    """A persisted cancellation record."""

    id: str
    job_id: int
    request_id: str | None
    reason: str | None
    force: bool
    cascade: bool
    initiated_by: str | None
    initiated_at: datetime
    status: str
    settled: bool
    steps: list[Step]
    result: dict[str, Any] | None
    error: str | None
    completed_at: datetime | None
    hidden_jobs: int = Field(
        default=0, description="Jobs of other principals the cascade reached (not listed)."
    )

    @classmethod
    def of(cls, rec: CancellationRecord) -> CancellationRecordOut:
        """The API view of a record."""
        return cls(
            id=rec.id,
            job_id=rec.job_id,
            request_id=rec.request_id,
            reason=rec.reason,
            force=rec.force,
            cascade=rec.cascade,
            initiated_by=rec.initiated_by,
            initiated_at=rec.initiated_at,
            status=rec.status,
            settled=rec.settled,
            steps=[Step.of(s) for s in rec.steps],
            result=rec.result.to_json() if rec.result is not None else None,
            error=rec.error,
            completed_at=rec.completed_at,
        )


class CancellationStatus(BaseModel):
    """Where a job's cancellation stands; ``cancellation`` is ``None`` if it has none.

    ``settled``: the record is final (it may say ``partial`` while the job still stops);
    ``stopped``: the job no longer runs."""

    job_id: int
    state: JobState
    display_state: str
    settled: bool
    stopped: bool
    success: bool | None
    errors: list[str]
    cancellation: CancellationRecordOut | None


class Deleted(BaseModel):
    """A deleted job and the active children its deletion cancelled."""

    deleted: int
    children_cancelled: list[int]


class DurableStepOut(BaseModel):
    """A durable step of a job: a function's result (``step``), a sleep or a wait for a
    signal; ``state`` is ``done``, ``waiting`` (until ``wakes_at``; null: no limit) or
    ``timed_out``."""

    name: str
    kind: Literal["step", "sleep", "signal"]
    state: Literal["done", "waiting", "timed_out"]
    result: Any = None
    attempt: int
    started_at: datetime
    finished_at: datetime | None
    wakes_at: datetime | None
    usage: int

    @classmethod
    def of(cls, step: StepInfo) -> DurableStepOut:
        """The API view of a step."""
        return cls(
            name=step.name,
            kind=step.kind,  # type: ignore[arg-type]  # the table's CHECK holds it
            state=step.state,  # type: ignore[arg-type]
            result=step.result,
            attempt=step.attempt,
            started_at=step.started_at,
            finished_at=step.finished_at,
            wakes_at=step.wakes_at,
            usage=step.usage,
        )


class DurableStepList(BaseModel):
    """A job's durable steps in the order they began, and what it waits for, in words
    (null: nothing; it is not parked in a sleep or a wait)."""

    items: list[DurableStepOut]
    waiting_for: str | None


class SignalIn(_In):
    """A signal's payload: any JSON value (``ctx.wait_for`` returns it)."""

    payload: Any = None


class SignalOut(BaseModel):
    """What became of a signal: ``woke`` (the job was parked waiting for it and runs
    now), ``kept`` (it gets it when it waits) or ``duplicate`` (already sent)."""

    job_id: int
    signal: str
    answer: Literal["woke", "kept", "duplicate"]


class JobLogLineOut(BaseModel):
    """A line of a job's own log (``ctx.log``). ``seq`` numbers the job's lines from 1;
    a last line of level ``dropped`` counts (``dropped``) the lines a full log did not
    keep."""

    seq: int
    attempt: int
    at: datetime = Field(description="The worker's clock when the handler wrote it.")
    level: str
    message: str
    dropped: int = 0

    @classmethod
    def of(cls, line: LogLine) -> JobLogLineOut:
        """The API view of a line."""
        return cls(
            seq=line.seq,
            attempt=line.attempt,
            at=line.at,
            level=line.level,
            message=line.message,
            dropped=line.dropped,
        )


class JobLogList(BaseModel):
    """A job's lines after ``after``, in order; ``next_after`` is the seq to ask for
    next (the last line's, or ``after`` if there was none); ``finished`` says the job
    has finished, so no line will follow."""

    items: list[JobLogLineOut]
    next_after: int
    finished: bool
    hidden_jobs: int = Field(
        default=0, description="Jobs of other principals the lines named (not shown)."
    )
