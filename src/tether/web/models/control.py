"""The bodies of the control routes (:mod:`tether.web.routes.control`): queues, keys,
workers, cancellation records, counts and the audit log."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from tether.job import AuditEntry, LimitInfo, QueueBacklog, QueueInfo, WorkerInfo
from tether.web.models.common import Text, _In
from tether.web.models.jobs import CancellationRecordOut


class QueuePauseIn(_In):
    """Why the queue is paused."""

    reason: Text | None = None


class CancellationPage(BaseModel):
    """Cancellation records, newest first."""

    items: list[CancellationRecordOut]
    limit: int
    offset: int
    next_offset: int | None


class QueueOut(BaseModel):
    """A queue: whether it is paused, and its jobs by state."""

    name: str
    paused: bool
    reason: str | None
    counts: dict[str, int]
    unserved: dict[str, str] = Field(
        default_factory=dict,
        description="Tasks with waiting jobs on this queue that no live worker can run, "
        "each with why.",
    )

    @classmethod
    def of(cls, q: QueueInfo) -> QueueOut:
        """The API view of a queue."""
        return cls(
            name=q.name,
            paused=q.paused,
            reason=q.reason,
            counts=q.counts,
            unserved={u.task: u.reason for u in q.unserved},
        )


class QueueList(BaseModel):
    """Every queue that has jobs or a pause flag."""

    items: list[QueueOut]


class BacklogCounts(BaseModel):
    """Jobs waiting, due now and running."""

    queued: int = Field(description="Jobs waiting: queued or retrying, due or not.")
    due: int = Field(description="Of those, the jobs whose start time has come.")
    running: int = Field(description="Jobs running.")
    demand: int = Field(
        description="Running plus due (unless the queue is paused): the worker slots "
        "wanted now. Divided by a worker's concurrency, the workers to run (a scaler that "
        "read only ``due`` would scale down while the jobs still run)."
    )


class QueueBacklogOut(BacklogCounts):
    """One queue's backlog."""

    paused: bool = Field(description="Whether the queue is paused: its jobs wait anyway.")

    @classmethod
    def of(cls, b: QueueBacklog) -> QueueBacklogOut:
        """The API view of a queue's backlog."""
        return cls(
            queued=b.waiting,
            due=b.due,
            running=b.running,
            demand=b.running + (0 if b.paused else b.due),
            paused=b.paused,
        )


class Backlog(BaseModel):
    """The backlog per queue and in total, for autoscalers (a KEDA metrics-api scaler
    reads ``total.demand`` of ``?queue=NAME``, or ``queues.<name>.demand``)."""

    queues: dict[str, QueueBacklogOut]
    total: BacklogCounts


class KeyOut(BaseModel):
    """A concurrency key or resource pool, and why it may be blocked."""

    name: str
    kind: str
    capacity: int
    running: int
    held: int
    waiting: int
    block_on_hold: bool
    blocked_reason: str | None

    @classmethod
    def of(cls, lim: LimitInfo) -> KeyOut:
        """The API view of a limit (its name without the ``key:``/``resource:`` prefix)."""
        return cls(
            name=lim.name.split(":", 1)[1] if ":" in lim.name else lim.name,
            kind=lim.kind,
            capacity=lim.capacity,
            running=lim.used,
            held=lim.held,
            waiting=lim.queued,
            block_on_hold=lim.block_on_hold,
            blocked_reason=lim.blocked_reason,
        )


class KeyList(BaseModel):
    """Concurrency keys and resource pools."""

    items: list[KeyOut]


class WorkerOut(BaseModel):
    """A worker: its state, last heartbeat, and the running jobs it leases."""

    id: str
    name: str | None
    host: str
    pid: int
    state: str
    started_at: datetime
    heartbeat_at: datetime
    running_jobs: int
    abandoned_threads: int = Field(
        description="Handler threads the worker abandoned (they ignored being stopped) that "
        "still run."
    )
    thread_pool_full: bool = Field(
        description="Abandoned threads fill the worker's thread pool: it claims no thread jobs."
    )
    jobs: list[int]
    queues: list[str] = Field(default_factory=list, description="The queues it claims from.")
    tasks: list[str] | None = Field(
        default=None, description="The tasks it can run (null: not recorded, taken as all)."
    )

    @classmethod
    def of(cls, w: WorkerInfo, jobs: list[int]) -> WorkerOut:
        """The API view of a worker with the ids of its jobs the caller may see."""
        return cls(
            id=w.id,
            name=w.name,
            host=w.host,
            pid=w.pid,
            state=w.state,
            started_at=w.started_at,
            heartbeat_at=w.heartbeat_at,
            running_jobs=w.running_jobs,
            abandoned_threads=w.abandoned_threads,
            thread_pool_full=w.thread_pool_full,
            jobs=jobs,
            queues=list(w.queues),
            tasks=list(w.tasks) if w.tasks is not None else None,
        )


class WorkerList(BaseModel):
    """Workers, newest first."""

    items: list[WorkerOut]
    # The worker that leads maintenance (pruning, schedules), if one holds the lease.
    leader: str | None = None


class Stats(BaseModel):
    """Jobs in each state (every state present) and in all."""

    states: dict[str, int]
    total: int


class AuditOut(BaseModel):
    """One audit row."""

    id: int
    at: datetime
    actor: str
    action: str
    target: str | None
    result: str
    request_id: str | None
    detail: str | None

    @classmethod
    def of(cls, e: AuditEntry) -> AuditOut:
        """The API view of an audit row."""
        return cls(
            id=e.id,
            at=e.at,
            actor=e.actor,
            action=e.action,
            target=e.target,
            result=e.result,
            request_id=e.request_id,
            detail=e.detail,
        )


class AuditPage(BaseModel):
    """Audit rows, newest first."""

    items: list[AuditOut]
    limit: int
    offset: int
    next_offset: int | None
