"""Worker registrations (the workers' part of :class:`~tether.store.protocols.WorkerStore`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tether.job import WorkerInfo
from tether.procinfo import PidSpace, pid_space
from tether.store.common.base import SqlBase
from tether.store.driver import Tx


class WorkersSql(SqlBase):
    """A worker's row: who and where it is, its state, its threads."""

    #: The database session whose end tells that this store's workers died, if the
    #: dialect has one (PostgreSQL's LISTEN session); None: a worker's liveness is its
    #: process and its heartbeats. Read as the row is written.
    _backend_pid: int | None = None

    async def _worker_session(self, worker_id: str) -> None:
        """Before ``worker_id``'s row is written: make sure :attr:`_backend_pid` is the
        session's (see the PostgreSQL store's override)."""

    def _worker_gone(self, worker_id: str) -> None:
        """``worker_id`` stopped or is dead: no session speaks for it any more."""

    async def worker_idle(self, worker_id: str, idle: bool) -> None:
        """Nothing by default (SQLite has no pool to size); see the PostgreSQL store's."""

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
        space = pid_space() if space is None else space
        await self._worker_session(worker_id)
        params = {
            "id": worker_id,
            "name": name,
            "host": host,
            "pid": pid,
            "pid_start": pid_start,
            "boot_id": space.boot_id,
            "pid_ns": space.pid_ns,
            "machine_id": space.machine_id,
            "queues": ",".join(queues),
            "concurrency": concurrency,
            "tasks": json.dumps(sorted(tasks)) if tasks is not None else None,
            "schedules": json.dumps(sorted(schedules)) if schedules is not None else None,
        }

        async def body(tx: Tx) -> None:
            # The session's pid as of the write: it changes when the session reconnects.
            await tx.run(
                self.sql.workers.REGISTER_WORKER, {**params, "backend_pid": self._backend_pid}
            )

        await self._change(body)

    async def set_worker_state(self, worker_id: str, state: str) -> None:
        if state in ("stopped", "dead"):
            self._worker_gone(worker_id)

        async def body(tx: Tx) -> None:
            await tx.run(self.sql.workers.SET_WORKER_STATE, {"id": worker_id, "state": state})

        await self._change(body)

    async def set_worker_threads(self, worker_id: str, abandoned: int, pool_full: bool) -> None:
        params = {"id": worker_id, "abandoned": abandoned, "pool_full": pool_full}

        async def body(tx: Tx) -> None:
            await tx.run(self.sql.workers.SET_WORKER_THREADS, params)

        await self._change(body)

    async def list_workers(self) -> list[WorkerInfo]:
        async def body(tx: Tx) -> list[WorkerInfo]:
            return [self._rows.worker(r) for r in await tx.all(self.sql.workers.LIST_WORKERS)]

        return await self._query(body)
