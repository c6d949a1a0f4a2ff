"""The narrow boundary between tether and its databases.

Everything above this package talks to a :class:`Store`; only the modules in this
package speak SQL or import a database driver. Both stores pass the same conformance
suite (``tests/conformance``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
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
from tether.ops import LeaderInfo, PruneBatch, ScheduleRow
from tether.procinfo import PidSpace, WorkerProcess

ProcessGone = Callable[[WorkerProcess], bool]
"""Whether a worker's recorded process is known to be gone (see :mod:`tether.procinfo`)."""


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


def shipped_versions(url: str) -> set[int]:
    """The migration versions this code ships for the database at ``url``."""
    dialect = "sqlite" if url.startswith("sqlite") else "postgres"
    return {m.version for m in load_migrations(dialect)}


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

    async def applied_migrations(self) -> set[int]:
        """Every migration version recorded in the database (empty for a fresh one)."""

    # -- producers and readers ---------------------------------------------------------

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Job]:
        """Insert jobs in one transaction. A known idempotency key returns the existing job.

        The key answers first, as a retried request expects: an entry whose key exists
        gets that job as it is, and nothing else about the entry is checked again (not
        even dependencies that have since been cancelled).
        """

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
        expect: str | None = None,
    ) -> bool:
        """Record a cancellation's progress; ``final`` stamps its completion.

        With ``expect``, only while the record's status is still ``expect`` (whoever
        drives a record checks that nobody else settled it meanwhile). Returns whether
        the record was written.
        """

    async def get_cancellation(
        self, *, job_id: int | None, request_id: str | None
    ) -> CancellationRow | None:
        """The cancellation record of a job, or with a request id."""

    async def list_cancellations(
        self, limit: int, offset: int, status: str | None = None
    ) -> list[CancellationRow]:
        """Cancellation records, newest first (only those with ``status``, if given)."""

    async def list_stale_cancellations(
        self, older_than: float, limit: int
    ) -> list[CancellationRow]:
        """Records not settled yet that were started more than ``older_than`` seconds ago
        (database time), oldest first."""

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
        space: PidSpace | None = None,
        tasks: Sequence[str] | None = None,
    ) -> None:
        """Record a worker incarnation as active, with the queues and tasks it serves;
        ``pid`` belongs to ``space`` (by default this process's)."""

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

    async def mark_dead_workers(self, process_gone: ProcessGone, session_grace: float) -> list[str]:
        """Mark workers dead whose process ``process_gone`` says is gone, or (PostgreSQL)
        whose session is gone and whose heartbeat is older than ``session_grace``."""

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

    # -- maintenance: the leader's lease and retention ---------------------------------

    async def db_time(self) -> datetime:
        """The clock leases and schedules go by (PostgreSQL's ``now()``; on SQLite,
        this host's clock)."""

    async def lead(self, name: str, holder: str, ttl: float) -> LeaderInfo:
        """Take the lease ``name`` for ``ttl`` seconds if it is free or ran out, or renew
        it if ``holder`` has it; return whoever holds it now."""

    async def resign(self, name: str, holder: str) -> None:
        """Give up the lease ``name`` if ``holder`` has it."""

    async def get_leader(self, name: str) -> LeaderInfo | None:
        """Who holds the lease ``name``, if anybody took it yet."""

    async def prune_jobs(
        self,
        state: str,
        older_than: float,
        limit: int,
        after: tuple[object, int] | None,
        dry_run: bool,
    ) -> PruneBatch:
        """Delete (or with ``dry_run`` count) up to ``limit`` jobs in the final ``state``
        that finished more than ``older_than`` seconds ago, oldest first, after the
        ``after`` cursor of the previous batch, with their events, dependency links,
        artifacts and cancellation records. Jobs whose workflow has an active member
        are kept, and so is a failed job that holds its concurrency key."""

    async def prune_rows(self, kind: str, older_than: float, limit: int, dry_run: bool) -> int:
        """Delete (or count) up to ``limit`` rows of ``kind`` older than ``older_than``
        seconds: ``audit`` rows, or ``workers`` rows stopped or dead that long."""

    # -- periodic schedules --------------------------------------------------------------

    async def sync_schedule(
        self, name: str, task: str, cron: str, timezone: str, start: datetime
    ) -> ScheduleRow:
        """Record a schedule's definition; a new one starts after ``start`` (its
        ``last_tick``), an existing one keeps its state. Returns the row."""

    async def advance_schedule(
        self, name: str, tick: datetime, next_tick: datetime | None, job_id: int | None
    ) -> bool:
        """Move a schedule's ``last_tick`` forward to ``tick`` (never back), with the job
        enqueued for it, if any; ``False`` if another scheduler got there first."""

    async def list_schedules(self) -> list[ScheduleRow]:
        """Every schedule row, by name."""

    async def set_schedule_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume a schedule; ``False`` if there is no such schedule."""
