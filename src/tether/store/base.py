"""The narrow boundary between tether and its databases.

Everything above this package talks to a :class:`Store`; only the modules in this
package speak SQL or import a database driver. Both stores pass the same conformance
suite (``tests/conformance``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Protocol, runtime_checkable

from tether.errors import InvalidJobError
from tether.hints import Hints
from tether.job import (
    ArtifactInfo,
    AuditEntry,
    Beat,
    CancellationRow,
    FeedEvent,
    HeartbeatResult,
    Job,
    JobEvent,
    JobFilter,
    LimitInfo,
    NewJob,
    Outcome,
    QueueInfo,
    RateLimitInfo,
    TokenInfo,
    WorkerInfo,
)

PidAlive = Callable[[int, int | None], bool]
"""``(pid, pid_start) -> alive``: whether a process on this host still runs."""


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str


def load_migrations(dialect: str) -> list[Migration]:
    """The migrations shipped for ``dialect``, in order."""
    folder = resources.files("tether.store") / "migrations" / dialect
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append(Migration(version, entry.name, entry.read_text("utf-8")))
    return sorted(found, key=lambda m: m.version)


def check_dependencies(wanted: Sequence[int], found: dict[int, str]) -> None:
    """Refuse dependencies that do not exist or can never succeed (``found``: the state
    of each job known, a superset of ``wanted`` or not)."""
    missing = sorted({i for i in wanted if i not in found})
    if missing:
        raise InvalidJobError(f"unknown dependency id(s): {', '.join(map(str, missing))}")
    dead = sorted({i for i in wanted if found[i] in ("failed", "cancelled")})
    if dead:
        raise InvalidJobError(
            f"dependency {dead[0]} is {found[dead[0]]}; a job depending on it could never run"
        )


@runtime_checkable
class Store(Protocol):
    """What tether needs from a database. Every method is a short transaction."""

    url: str
    hints: Hints

    async def open(self) -> None:
        """Connect. Idempotent."""

    async def close(self) -> None:
        """Release connections and background tasks. Idempotent."""

    async def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied now."""

    async def schema_version(self) -> int:
        """The newest applied migration, 0 for an empty database."""

    # -- producers and readers ---------------------------------------------------------

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Job]:
        """Insert jobs in one transaction. A known idempotency key returns the existing job."""

    async def get(self, job_id: int) -> Job | None:
        """One job, or ``None``."""

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        """Jobs matching ``flt``, newest first."""

    async def count_by_state(self) -> dict[str, int]:
        """Number of jobs in each state (states with none are left out)."""

    async def events(self, job_id: int) -> list[JobEvent]:
        """A job's transitions, oldest first."""

    async def request_cancel(
        self,
        job_id: int,
        reason: str | None,
        force: bool,
        actor: str | None,
        cascade: bool = True,
    ) -> Job:
        """Cancel a job that is not running at once; flag a running one.

        Returns the job after the change. A terminal job is returned unchanged, so the
        caller can say what happened. Raises ``JobNotFoundError``.
        """

    async def request_pause(self, job_id: int, reason: str | None, actor: str | None) -> Job:
        """Pause a queued or retrying job at once; flag a running one. Others unchanged."""

    async def resume(self, job_id: int, budget: int | None, actor: str | None) -> Job:
        """Queue a paused job again (or withdraw a pending pause). Others unchanged."""

    async def retry(self, job_id: int, actor: str | None) -> Job:
        """Queue a failed job again with fresh attempts. Others unchanged."""

    # -- queues, limits, artifacts, cancellations ----------------------------------------

    async def set_queue_paused(self, name: str, paused: bool, reason: str | None) -> None:
        """Pause or resume claims from a queue."""

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue that has jobs or a pause flag."""

    async def define_limit(self, name: str, kind: str, capacity: int, block_on_hold: bool) -> None:
        """Create or change a concurrency key or resource pool."""

    async def list_limits(self) -> list[LimitInfo]:
        """Every key and resource pool with its counters."""

    async def waiting_by_task(self) -> dict[tuple[str, str], int]:
        """Queued and retrying jobs, counted by ``(queue, task)``."""

    async def set_rate_limit(self, scope: str, name: str, per_second: float, burst: int) -> None:
        """Create or change the rate limit of a queue or task (``scope``); a new or
        changed limit starts with a full bucket."""

    async def remove_rate_limit(self, scope: str, name: str) -> bool:
        """Drop a rate limit; ``False`` if there was none."""

    async def list_rate_limits(self) -> list[RateLimitInfo]:
        """Every rate limit, by scope and name."""

    async def save_artifact(self, job_id: int, lease_token: int, name: str, data: bytes) -> bool:
        """Fenced write of an artifact; ``False`` means the lease is lost."""

    async def list_artifacts(self, job_id: int) -> list[ArtifactInfo]:
        """A job's artifacts (without their bytes)."""

    async def get_artifact(self, job_id: int, name: str) -> bytes | None:
        """One artifact's bytes."""

    async def create_cancellation(
        self,
        cancellation_id: str,
        job_id: int,
        request_id: str | None,
        reason: str | None,
        force: bool,
        cascade: bool,
        initiated_by: str | None,
    ) -> tuple[CancellationRow, bool]:
        """Create the job's cancellation record, or return the existing one (``False``)."""

    async def update_cancellation(
        self,
        cancellation_id: str,
        status: str,
        steps: list[dict[str, object]],
        result: dict[str, object] | None,
        error: str | None,
        final: bool,
    ) -> None:
        """Record a cancellation's progress; ``final`` stamps its completion."""

    async def get_cancellation(
        self, *, job_id: int | None, request_id: str | None
    ) -> CancellationRow | None:
        """The cancellation record of a job, or with a request id."""

    async def list_cancellations(
        self, limit: int, offset: int, status: str | None = None
    ) -> list[CancellationRow]:
        """Cancellation records, newest first (only those with ``status``, if given)."""

    # -- workers -----------------------------------------------------------------------

    async def register_worker(
        self,
        worker_id: str,
        name: str | None,
        host: str,
        pid: int,
        pid_start: int | None,
        queues: Sequence[str],
        concurrency: int,
        tasks: Sequence[str] | None = None,
    ) -> None:
        """Record a worker incarnation as active, with the queues and tasks it serves."""

    async def set_worker_state(self, worker_id: str, state: str) -> None:
        """Move a worker to ``active``, ``draining``, ``stopped`` or ``dead``."""

    async def set_worker_threads(self, worker_id: str, abandoned: int, pool_full: bool) -> None:
        """Record how many abandoned handler threads the worker still has running, and
        whether they fill its thread pool (so it claims no thread jobs)."""

    async def list_workers(self) -> list[WorkerInfo]:
        """Every worker row, newest first, with the leases each holds."""

    async def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        lease_duration: float,
    ) -> list[Job]:
        """Lease up to ``limit`` claimable jobs, bumping each lease token.

        A job whose queue or task has a rate limit is taken only while that limit's
        bucket holds a token, and taking it spends one, in the same transaction."""

    async def heartbeat(
        self, worker_id: str, beats: Sequence[Beat], lease_duration: float
    ) -> HeartbeatResult:
        """One write: extend these leases, flush progress, touch the worker row.

        Returns the leases still held and their pending control requests.
        """

    async def save_checkpoint(self, job_id: int, lease_token: int, checkpoint_json: str) -> bool:
        """Fenced write of a checkpoint; ``False`` means the lease is lost."""

    async def finish(self, worker_id: str, outcomes: Sequence[Outcome]) -> set[int]:
        """Record how attempts ended, fenced. Returns the ids whose write was accepted."""

    # -- workflows -----------------------------------------------------------------------

    async def spawn(self, parent_id: int, lease_token: int, job: NewJob) -> Job | None:
        """Create a child of a running parent, fenced by its lease (``None``: refused)."""

    async def delete(self, job_id: int, actor: str | None) -> tuple[Job, list[Job]]:
        """Delete a job, cancelling its active children first; returns the job as it was
        and the children cancelled."""

    async def downstream(self, job_ids: Sequence[int]) -> list[Job]:
        """Every job reachable from these through dependencies and children."""

    async def dependencies(self, job_id: int) -> tuple[list[int], list[int]]:
        """The ids a job depends on, and the ids that depend on it."""

    # -- maintenance -------------------------------------------------------------------

    async def mark_dead_workers(
        self, host: str, pid_alive: PidAlive, session_grace: float
    ) -> list[str]:
        """Mark workers dead whose process is gone on ``host``, or whose session is gone."""

    async def rescue(self) -> list[Job]:
        """Fenced rescue of running jobs whose lease expired or whose worker is dead."""

    # -- API: tokens, audit log, live feed -------------------------------------------

    async def create_token(self, name: str, role: str, token_hash: str) -> TokenInfo | None:
        """Store a new token's hash; ``None`` if an active token already has this name."""

    async def list_tokens(self) -> list[TokenInfo]:
        """Every token, active and revoked, oldest first."""

    async def revoke_token(self, name: str) -> bool:
        """Revoke the active token with this name; ``False`` if there is none."""

    async def find_token(self, token_hash: str) -> TokenInfo | None:
        """The active token with this hash, or ``None``."""

    async def append_audit(
        self,
        actor: str,
        action: str,
        target: str | None,
        result: str,
        request_id: str | None,
        detail: str | None,
    ) -> AuditEntry:
        """Add one audit row, stamped with database time."""

    async def list_audit(self, limit: int, offset: int) -> list[AuditEntry]:
        """Audit rows, newest first."""

    async def feed(
        self,
        after_id: int,
        *,
        job_id: int | None,
        queue: str | None,
        owner: str | None,
        states: Sequence[str] | None,
        limit: int,
    ) -> list[FeedEvent]:
        """Transitions with an event id above ``after_id``, oldest first, filtered."""

    async def last_event_id(self) -> int:
        """The newest event id, 0 if there is none."""

    async def list_owned_cancellations(
        self, owner: str, limit: int, offset: int
    ) -> list[CancellationRow]:
        """Cancellation records of the jobs ``owner`` enqueued, newest first."""
