"""Maintenance: rescue, the leader's lease, retention."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol, runtime_checkable

from tether.job import Job
from tether.ops import LeaderInfo, PruneBatch
from tether.procinfo import WorkerProcess

ProcessGone = Callable[[WorkerProcess], bool]
"""Whether a worker's recorded process is known to be gone (see :mod:`tether.procinfo`)."""


@runtime_checkable
class MaintenanceStore(Protocol):
    """Maintenance: finding dead workers and rescuing their jobs, the maintenance
    leader's lease, and retention (pruning old jobs and rows)."""

    async def mark_dead_workers(
        self,
        process_gone: ProcessGone,
        session_grace: float,
        still: Collection[str] | None = None,
    ) -> list[str]:
        """Mark workers dead whose process ``process_gone`` says is gone, or (PostgreSQL)
        whose session is gone and whose heartbeat is older than ``session_grace``. With
        ``still``, a lost session counts only for those workers: the ones whose beat
        count the caller watched stand still for ``session_grace`` on its own monotonic
        clock (a database clock that steps forward must not declare a beating worker
        dead)."""

    async def worker_beats(self) -> dict[str, tuple[int, float | None]]:
        """Every live worker's beat counter and the lease its last beat granted
        (``None`` before its first beat), by worker id; a plain read."""

    async def rescue(self, quiet: Mapping[str, int] | None = None) -> list[Job]:
        """Fenced rescue of running jobs whose worker is dead (its process or session
        gone, or stopped), or whose lease expired while their worker is ``quiet``: the
        caller watched its beat counter stay at the value given for at least the lease
        (the count is checked again under the row's lock). ``None``: judge by the lease
        alone. Rows held by another client are skipped, never waited for."""

    async def release_stuck(self, after: int, limit: int) -> tuple[list[int], int | None]:
        """Run again up to ``limit`` workflow steps left pending (PostgreSQL: a step that
        met a row held past its lock timeout), and release the blocked jobs that wait on
        something that has already happened (a parent whose children have all ended; a
        dependent whose dependencies all succeeded, or of one that failed or was
        cancelled with cascade) among the next ``limit`` blocked jobs after id
        ``after``, as their workflow steps would have. Returns the ids of the jobs whose
        steps ran again and of the blocked jobs found, and the cursor of the next batch
        of blocked jobs (``None``: the last batch)."""

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
        failed_age: float | None = None,
    ) -> PruneBatch:
        """Delete (or with ``dry_run`` count) up to ``limit`` jobs in the final ``state``
        that finished more than ``older_than`` seconds ago, oldest first, after the
        ``after`` cursor of the previous batch, with their events, dependency links,
        artifacts and cancellation records. A failed job that holds its concurrency key
        is kept. So is every job of a workflow (the jobs connected through parents,
        children and dependencies) with a member that keeps it: an active one, or a
        failed one that finished less than ``failed_age`` seconds ago (with ``None``,
        any failed one) or holds its concurrency key, since a person may retry it."""

    async def prune_rows(self, kind: str, older_than: float, limit: int, dry_run: bool) -> int:
        """Delete (or count) up to ``limit`` rows of ``kind`` older than ``older_than``
        seconds: ``audit`` rows, or ``workers`` rows stopped or dead that long."""
