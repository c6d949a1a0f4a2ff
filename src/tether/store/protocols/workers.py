"""The worker registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tether.job import WorkerInfo
from tether.procinfo import PidSpace


@runtime_checkable
class WorkerStore(Protocol):
    """The worker registry: each worker incarnation, its state, what it serves and the
    leases it holds."""

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
        schedules: Sequence[str] | None = None,
    ) -> None:
        """Record a worker incarnation as active, with the queues and tasks it serves
        and the names of the schedules its app declares; ``pid`` belongs to ``space``
        (by default this process's)."""

    async def worker_idle(self, worker_id: str, idle: bool) -> None:
        """Say whether a worker of this process is idle: it holds no job and its last
        claim found none. PostgreSQL keeps one pooled connection while all of them are
        idle, and lets the pool grow to its size again when one is not; SQLite has
        nothing to size."""

    async def set_worker_state(self, worker_id: str, state: str) -> None:
        """Move a worker to ``active``, ``draining``, ``stopped`` or ``dead``."""

    async def set_worker_threads(self, worker_id: str, abandoned: int, pool_full: bool) -> None:
        """Record how many abandoned handler threads the worker still has running, and
        whether they fill its thread pool (so it claims no thread jobs)."""

    async def list_workers(self) -> list[WorkerInfo]:
        """Every worker row, newest first, with the leases each holds."""
