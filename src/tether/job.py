"""The records tether keeps: jobs, their events, workers, and what writes carry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tether.states import TERMINAL, JobState

JSON = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged."""


@dataclass(frozen=True)
class Job:
    """A snapshot of one row of ``tether_jobs``."""

    id: int
    task: str
    args: dict[str, JSON]
    queue: str
    priority: int
    key: str | None
    state: JobState
    attempt: int
    max_attempts: int
    timeout: float | None
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    lease_token: int
    lease_expires_at: datetime | None
    heartbeat_at: datetime | None
    cancel_requested_at: datetime | None
    cancel_reason: str | None
    cancel_force: bool
    checkpoint: JSON | None
    progress_current: int | None
    progress_total: int | None
    result: JSON | None
    error: str | None
    owner: str | None
    idempotency_key: str | None
    pause_requested_at: datetime | None = None
    pause_reason: str | None = None
    budget: int | None = None
    usage: int = 0
    limits: tuple[str, ...] = ()
    stopped_by: str | None = None
    parent_id: int | None = None
    phase: str | None = None
    waiting_children: bool = False
    cancel_cascade: bool = True
    #: String labels set at enqueue and carried with the job (a trace context, say);
    #: ``None`` when it has none.
    meta: dict[str, str] | None = None

    @property
    def key_limit(self) -> str | None:
        """The limit name of this job's concurrency key, if it has one."""
        return f"key:{self.key}" if self.key is not None else None

    @property
    def is_terminal(self) -> bool:
        """Whether the job is ``succeeded``, ``failed`` or ``cancelled``."""
        return self.state in TERMINAL

    @property
    def display_state(self) -> str:
        """The state as people see it: a running job with a cancel request is cancelling."""
        if self.state is JobState.RUNNING and self.cancel_requested_at is not None:
            return "cancelling"
        if self.state is JobState.RUNNING and self.pause_requested_at is not None:
            return "pausing"
        if self.state is JobState.BLOCKED and self.waiting_children:
            return "waiting for children"
        return self.state.value


@dataclass(frozen=True)
class NewJob:
    """What enqueue needs to create one job; the store fills in everything else."""

    task: str
    args_json: str
    queue: str
    priority: int = 0
    key: str | None = None
    max_attempts: int = 3
    timeout: float | None = None
    delay: float = 0.0
    owner: str | None = None
    idempotency_key: str | None = None
    budget: int | None = None
    limits: tuple[str, ...] = ()
    parent_id: int | None = None
    depends_on: tuple[int, ...] = ()
    # Dependencies on earlier entries of the same enqueue batch, by position.
    depends_on_batch: tuple[int, ...] = ()
    # An absolute start time (aware); when set, it replaces ``delay``.
    run_at: datetime | None = None
    # Seconds the idempotency key stays taken by this job; None: for ever.
    unique_for: float | None = None
    # String labels carried with the job (checked by tether.job_meta); None: none.
    meta: Mapping[str, str] | None = None


@dataclass(frozen=True)
class JobEvent:
    """One transition of one job, stamped with database time.

    ``id`` orders the stored transitions; it is ``None`` for one read off the job's own
    row (its creation by an enqueue, the claim of its current run, its success), which
    PostgreSQL does not store while no process follows the transitions.
    """

    id: int | None
    job_id: int
    from_state: JobState | None
    to_state: JobState
    at: datetime
    worker_id: str | None
    actor: str | None
    reason: str | None


@dataclass(frozen=True)
class WorkerInfo:
    """One row of ``tether_workers`` with the number of leases it holds."""

    id: str
    name: str | None
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    state: str
    running_jobs: int = 0
    #: Handler threads the worker abandoned (they ignored being stopped) that still run.
    abandoned_threads: int = 0
    #: Abandoned threads fill the worker's thread pool: it claims no thread jobs.
    thread_pool_full: bool = False
    #: The queues it claims from.
    queues: tuple[str, ...] = ()
    #: The tasks it can run; ``None``: not recorded (a worker from before version 20),
    #: taken to serve every task.
    tasks: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Beat:
    """One lease a heartbeat extends, with the progress to flush alongside."""

    job_id: int
    lease_token: int
    progress_current: int | None = None
    progress_total: int | None = None
    usage: int | None = None


@dataclass(frozen=True)
class ControlRequest:
    """A pending request on a job the heartbeat found still leased."""

    job_id: int
    cancel: bool
    force: bool
    pause: bool = False


@dataclass(frozen=True)
class HeartbeatResult:
    """What one heartbeat write returns: leases kept and control requests pending.

    ``alive`` holds every lease still ours, ``held`` those of them whose row someone
    else had locked (their lease was not extended this round; the worker keeps running
    them). ``counted`` says whether the beat reached the worker's row (its beat counter,
    which the rescuers watch): a round that did not is no proof of life.
    """

    alive: frozenset[int]
    requests: tuple[ControlRequest, ...] = ()
    held: frozenset[int] = frozenset()
    counted: bool = True


class Finished(set[int]):
    """What a finish returns: the ids whose outcome was recorded, and in :attr:`held`
    those whose row someone else had locked (still ours; try again later)."""

    held: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended, as the worker asks the store to record it.

    ``state`` is the target: succeeded, failed, retrying, cancelled, or queued (a
    release that does not spend the attempt). The store turns a failure, retry or
    release of a job with a pending cancel into ``cancelled``.
    """

    job_id: int
    lease_token: int
    state: JobState
    result_json: str | None = None
    error: str | None = None
    delay: float = 0.0
    reason: str | None = None
    stopped_by: str | None = None
    usage: int | None = None
    phase: str | None = None
    progress_current: int | None = None
    progress_total: int | None = None


@dataclass(frozen=True)
class JobFilter:
    """Filters for listing jobs; ``None`` means any."""

    states: tuple[JobState, ...] | None = None
    queue: str | None = None
    task: str | None = None
    key: str | None = None
    owner: str | None = None
    worker_id: str | None = None
    parent_id: int | None = None
    limit: int = 100
    offset: int = 0
    ids: tuple[int, ...] | None = field(default=None)
    # Jobs whose meta holds every one of these keys with these values.
    meta: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Unserved:
    """Waiting jobs of one task on one queue that no live worker serves."""

    queue: str
    task: str
    jobs: int
    reason: str


@dataclass(frozen=True)
class QueueInfo:
    """A queue: whether it is paused, and its jobs by state."""

    name: str
    paused: bool
    reason: str | None
    counts: dict[str, int]
    #: Its waiting jobs that no live worker can run, by task.
    unserved: tuple[Unserved, ...] = ()


@dataclass(frozen=True)
class QueueBacklog:
    """A queue's backlog, as an autoscaler reads it: jobs waiting (queued or retrying),
    those of them due now (``run_at`` passed), and jobs running."""

    name: str
    paused: bool
    waiting: int = 0
    due: int = 0
    running: int = 0


@dataclass(frozen=True)
class RateLimitInfo:
    """A rate limit on a queue or a task: a token bucket refilled at ``per_second`` up
    to ``burst``; every claim spends one token."""

    scope: str
    name: str
    per_second: float
    burst: int
    #: Tokens in the bucket when last refilled (a claim refills it first).
    tokens: float


@dataclass(frozen=True)
class LimitInfo:
    """A concurrency key or resource pool, with why it may be blocked."""

    name: str
    kind: str
    capacity: int
    used: int
    held: int
    block_on_hold: bool
    queued: int = 0

    @property
    def blocked_reason(self) -> str | None:
        """Why no more jobs under this limit can start now, or ``None``."""
        if self.held and self.block_on_hold:
            return f"{self.held} paused or failed job(s) hold the key"
        if self.used >= self.capacity:
            return f"at capacity ({self.used}/{self.capacity} running)"
        return None


@dataclass(frozen=True)
class ArtifactInfo:
    """An artifact a job saved (the bytes are fetched separately)."""

    job_id: int
    name: str
    size: int
    created_at: datetime


@dataclass(frozen=True)
class StepInfo:
    """A durable step of a job, as its attempts left it (see :meth:`JobContext.step`).

    ``kind`` is ``step`` (a function's result), ``sleep`` or ``signal`` (a wait for
    one). ``state`` is ``done``, ``waiting`` (a sleep or wait under way, until
    ``wakes_at``; ``None``: a wait with no timeout) or ``timed_out`` (a wait whose
    signal did not come in time). ``attempt`` is the attempt that wrote it last.
    """

    job_id: int
    name: str
    kind: str
    state: str
    result: JSON | None
    attempt: int
    started_at: datetime
    finished_at: datetime | None
    wakes_at: datetime | None
    usage: int = 0


@dataclass(frozen=True)
class WaitResult:
    """What a sleep or a wait found (:meth:`~tether.store.base.Store.wait`).

    ``outcome``: ``done`` (the sleep is over, or the signal is in: ``payload_json``),
    ``parked`` (the job left ``running`` and holds no lease until it wakes),
    ``timed_out`` (no signal by the deadline) or ``lost`` (the lease was lost).
    """

    outcome: str
    payload_json: str | None = None


@dataclass(frozen=True)
class CancellationRow:
    """A persisted cancellation record, as the store keeps it."""

    id: str
    job_id: int
    request_id: str | None
    reason: str | None
    force: bool
    cascade: bool
    initiated_by: str | None
    initiated_at: datetime
    status: str
    steps: list[dict[str, Any]]
    result: dict[str, Any] | None
    error: str | None
    completed_at: datetime | None


@dataclass(frozen=True)
class TokenInfo:
    """An API token as the store keeps it: never the token itself, only its hash."""

    id: int
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None
    # Not secret on its own (SHA-256 of 256 random bits), but no reason to print it.
    token_hash: str = field(repr=False, default="")


@dataclass(frozen=True)
class AuditEntry:
    """One row of the audit log: who tried what, on what, and how it ended."""

    id: int
    at: datetime
    actor: str
    action: str
    target: str | None
    result: str
    request_id: str | None
    detail: str | None


@dataclass(frozen=True)
class FeedEvent:
    """A transition for the live feed: the event plus the job's queue, task and owner.

    ``queue``, ``task`` and ``owner`` are ``None`` when the job has been deleted since.
    """

    event: JobEvent
    queue: str | None
    task: str | None
    owner: str | None

    @property
    def id(self) -> int:
        """The event's id: the feed reads stored transitions only, which all have one."""
        assert self.event.id is not None
        return self.event.id
