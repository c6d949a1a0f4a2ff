"""Helpers for the workflow tests: state probes, raw SQL, and a proof that a cascade
happened in one transaction, on both stores."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg

from tether import App, Job, JobState, Worker


async def in_state(app: App, job_id: int, *states: JobState) -> Job | None:
    """The job if it is in one of ``states`` (a probe for ``eventually``)."""
    job = await app.get(job_id)
    return job if job.state in states else None


async def idle(worker: Worker) -> bool:
    """Whether the worker runs no job (a probe for ``eventually``)."""
    return not worker.running


async def dialect(app: App) -> str:
    """``sqlite`` or ``postgresql``."""
    return str((await app.store()).dialect)


async def execute(app: App, *, sqlite: str, postgres: str, params: Sequence[Any] = ()) -> None:
    """Run one statement on the app's database from a separate connection, the way an
    operator (or a crash at the wrong moment) would change it behind tether's back."""
    store: Any = await app.store()
    if store.dialect == "sqlite":

        def run() -> None:
            with contextlib.closing(sqlite3.connect(store.path, timeout=10)) as conn, conn:
                conn.execute(sqlite, params)

        await asyncio.to_thread(run)
    else:
        async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:
            await conn.execute(postgres, params)  # type: ignore[arg-type]


class _BoundaryProbe:
    """SQLite: counts how many of ``ids`` have ended (cancelled or failed), as an
    independent reader sees them, at every transaction boundary of the store's writer
    connection.

    Every write of this process (the app's calls and its workers') goes through that one
    connection, so the list of counts is every committed state there was. A cascade that
    spans several transactions shows up as a count strictly between 0 and ``len(ids)``.
    """

    def __init__(self, store: Any, ids: Sequence[int]) -> None:
        # White-box on purpose: the SQLite store has exactly one writer connection.
        self.conn: sqlite3.Connection = store._conn
        assert self.conn is not None, "the store is not open"
        self.ids = list(ids)
        self.reader = sqlite3.connect(store.path, check_same_thread=False, timeout=10)
        marks = ", ".join("?" * len(self.ids))
        self.sql = (
            "SELECT COUNT(*) FROM tether_jobs WHERE state IN ('cancelled', 'failed') "
            f"AND id IN ({marks})"
        )
        self.seen: list[int] = []

    def count(self) -> int:
        return int(self.reader.execute(self.sql, self.ids).fetchone()[0])

    def trace(self, statement: str) -> None:
        if statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            self.seen.append(self.count())

    def __enter__(self) -> _BoundaryProbe:
        self.seen.append(self.count())
        self.conn.set_trace_callback(self.trace)
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.set_trace_callback(None)
        self.seen.append(self.count())
        self.reader.close()


@contextlib.asynccontextmanager
async def cancelled_in_one_transaction(
    app: App, trigger_id: int, ids: Sequence[int]
) -> AsyncIterator[None]:
    """Assert that every job of ``ids`` becomes cancelled, all in the very transaction
    that ended ``trigger_id`` (cancelled or failed), while the block runs.

    PostgreSQL: ``now()`` is the transaction's start time, so the trigger's final event
    and every cancel event carry the same ``at``. SQLite: no committed state in between
    is ever visible (see :class:`_BoundaryProbe`).
    """
    store: Any = await app.store()
    if store.dialect == "sqlite":
        everything = [trigger_id, *ids]
        with _BoundaryProbe(store, everything) as probe:
            yield
        partial = sorted({n for n in probe.seen if 0 < n < len(everything)})
        assert not partial, f"partial cascades were committed: {partial} of {len(everything)}"
        assert probe.seen[0] == 0 and probe.seen[-1] == len(everything), probe.seen
        assert len(probe.seen) > 2, "the probe saw no transaction boundary"
        return
    yield
    moments = {}
    for job_id in [trigger_id, *ids]:
        last = (await app.jobs.events(job_id))[-1]
        assert last.to_state in (JobState.CANCELLED, JobState.FAILED), (job_id, last)
        moments[job_id] = last.at
    assert len(set(moments.values())) == 1, (
        f"the cascade spans {len(set(moments.values()))} transactions"
    )
