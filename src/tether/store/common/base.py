"""What every shared store method may use: the dialect's SQL, its row readers and its
transactions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from types import ModuleType
from typing import Any

from tether.errors import JobNotFoundError
from tether.hints import Hints
from tether.job import Job
from tether.store.api_rows import ApiRowReader
from tether.store.driver import LOCK_WAIT, ROW_LOCK_WAIT, Body, T, Tx, lock_wait
from tether.store.rows import RowReader


class LeaseLost(Exception):
    """Raised in a body to roll back a worker's write whose lease was lost meanwhile."""


class SqlBase:
    """The dialect's parts, which each store sets in its ``__init__``."""

    dialect: str
    #: The dialect's named queries: a package whose modules mirror :mod:`tether.store.common`.
    sql: ModuleType
    hints: Hints
    _rows: RowReader
    _api: ApiRowReader

    async def _query(self, body: Body[T]) -> T:
        """Run ``body`` with statements that each commit on their own (reads)."""
        raise NotImplementedError

    async def _change(self, body: Body[T]) -> T:
        """Run ``body``, whose statements write, each atomic on its own: on PostgreSQL
        without a transaction block (no BEGIN and COMMIT round trips), on SQLite under
        the write lock. For a body of one statement, or of several that need not commit
        together."""
        raise NotImplementedError

    async def _transact(self, body: Body[T]) -> T:
        """Run ``body`` in one write transaction: all of it commits, or none."""
        raise NotImplementedError

    async def _transact_bounded(self, body: Body[T]) -> T:
        """:meth:`_transact`, its row-lock waits bounded by the caller's
        :data:`~tether.store.driver.LOCK_WAIT`, or else by
        :data:`~tether.store.driver.ROW_LOCK_WAIT`: for the writes that must wait on a
        row someone may hold (a job's, to fence a write or to delete it)."""
        wait = LOCK_WAIT.get()
        with lock_wait(ROW_LOCK_WAIT if wait is None else wait):
            return await self._transact(body)

    async def _after_transitions(self, tx: Tx, changed: list[int]) -> None:
        """The workflow consequences of state changes of ``changed``, in ``tx``.

        Nothing by default: PostgreSQL's transition trigger applies them inside the
        statement. SQLite's store overrides this (:mod:`tether.store.sqlite_workflow`).
        """

    async def _jobs(self, tx: Tx, ids: Sequence[int]) -> dict[int, Job]:
        """The jobs of ``ids`` that exist, by id."""
        rows = await tx.tuples(self.sql.rows.JOBS_BY_IDS, {"ids": list(ids)})
        jobs = (self._rows.job_from_tuple(r) for r in rows)
        return {job.id: job for job in jobs}

    async def _job(self, tx: Tx, job_id: int) -> Job:
        """The job ``job_id``; :class:`~tether.errors.JobNotFoundError` if there is none."""
        job = (await self._jobs(tx, [job_id])).get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return job

    async def _lease_held(self, tx: Tx, job_id: int, token: int, *, no_cancel: bool) -> bool:
        """Whether the lease of ``job_id`` is still ``token``'s (and, with ``no_cancel``,
        no cancel was asked for), checked after a worker's INSERT-based write (spawn,
        artifact) in its transaction; ``False``: raise :class:`LeaseLost` to roll it back.

        PostgreSQL's ``LEASE_HELD`` locks the job row until commit (its callers run under
        :meth:`_transact_bounded`, so a row held elsewhere is waited for only so long);
        SQLite needs no such
        fence (``LEASE_HELD`` is None): the write lock held since the INSERT lets nothing
        change.
        """
        query = self.sql.leases.LEASE_HELD
        if query is None:
            return True
        params = {"id": job_id, "token": token, "no_cancel": no_cancel}
        return await tx.one(query, params) is not None

    def _time(self, value: Any) -> datetime | None:
        """A time column as tether hands it out (an aware UTC datetime)."""
        return self._rows.time(value)
