"""Helpers for the conformance suite: direct SQL access and small job builders.

The suite speaks to every store through the :class:`~tether.store.Store` protocol.
Where a rule must hold even against hand-written SQL (triggers, CHECKs), or where a
test needs to move a timestamp instead of sleeping, it uses :class:`Db`, which opens
its own connection to the same database. Only tests do this; the package never does.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from tether.job import Job, JobEvent, NewJob, Outcome
from tether.states import JobState
from tether.store import Store, parse_sqlite_path
from tether.store.rows import epoch_to_dt

SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"

# Errors a direct statement may raise when the database refuses it.
DB_ERRORS = (sqlite3.Error, psycopg.Error)

_queue_ids = itertools.count(1)

# Float rounding of SQLite's epoch seconds: allow one millisecond either way.
SLACK = timedelta(milliseconds=2)


class Db:
    """Direct SQL on a store's database. Statements use ``%s`` placeholders."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[tuple[Any, ...]] | None = None

    def execute(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit mode and return its rows (if any)."""
        if self.dialect == "sqlite":
            if self._sqlite is None:
                self._sqlite = sqlite3.connect(
                    parse_sqlite_path(self.url), timeout=10, isolation_level=None
                )
            cur = self._sqlite.execute(statement.replace("%s", "?"), tuple(params))
            return list(cur.fetchall())
        if self._pg is None:
            self._pg = psycopg.connect(self.url, autocommit=True)
        cur2 = self._pg.execute(statement, tuple(params))
        return list(cur2.fetchall()) if cur2.description else []

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None
        if self._pg is not None:
            self._pg.close()
            self._pg = None

    def now(self) -> datetime:
        """The database clock, as the stores read it."""
        if self.dialect == "sqlite":
            value = self.execute(f"SELECT {SQLITE_NOW}")[0][0]
            out = epoch_to_dt(value)
            assert out is not None
            return out
        result: datetime = self.execute("SELECT now()")[0][0]
        return result

    def set_ago(self, table: str, column: str, row_id: Any, seconds: float) -> None:
        """Set ``column`` of one row to database-now minus ``seconds``."""
        if self.dialect == "sqlite":
            expr = f"{SQLITE_NOW} - %s"
        else:
            expr = "now() - make_interval(secs => %s)"
        self.execute(f"UPDATE {table} SET {column} = {expr} WHERE id = %s", (seconds, row_id))

    def expire_lease(self, job_id: int) -> None:
        """Make a running job's lease already expired, as if its worker went silent."""
        self.set_ago("tether_jobs", "lease_expires_at", job_id, 1.0)

    def make_due(self, job_id: int) -> None:
        """Move a job's ``run_at`` into the past, as if its delay had elapsed."""
        self.set_ago("tether_jobs", "run_at", job_id, 1.0)

    def state(self, job_id: int) -> str:
        rows = self.execute("SELECT state FROM tether_jobs WHERE id = %s", (job_id,))
        return str(rows[0][0])


KEPT_TABLES = ("tether_migrations", "tether_transitions", "tether_lighter_history")
"""What the migrations write: kept when a test empties a migrated schema."""


def empty_tables(pg_url: str) -> None:
    """Delete every row of the PostgreSQL schema at ``pg_url`` but the migrations'."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            )
            if r[0] not in KEPT_TABLES
        ]
        with conn.transaction():
            for table in tables:
                conn.execute(f'DELETE FROM "{table}"')


def assert_between(value: datetime | None, low: datetime, high: datetime) -> None:
    """``low <= value <= high``, allowing for float rounding of SQLite times."""
    assert value is not None
    assert low - SLACK <= value <= high + SLACK, (low, value, high)


def new_job(
    task: str = "t",
    queue: str = "default",
    args: dict[str, Any] | None = None,
    **fields: Any,
) -> NewJob:
    """A :class:`NewJob` with JSON-encoded args."""
    return NewJob(task=task, args_json=json.dumps(args or {}), queue=queue, **fields)


async def enqueue_one(store: Store, **fields: Any) -> Job:
    [job] = await store.enqueue([new_job(**fields)])
    return job


async def claim_one(
    store: Store,
    worker: str = "w1",
    *,
    queue: str = "default",
    task: str = "t",
    lease: float = 60.0,
) -> Job:
    """Claim exactly one job; fail the test if none is claimable."""
    jobs = await store.claim(worker, [queue], [task], 1, lease)
    assert len(jobs) == 1, jobs
    return jobs[0]


def fresh_queue() -> str:
    """A queue name no other job of the test uses."""
    return f"q{next(_queue_ids)}"


async def running_job(
    store: Store, worker: str = "w1", *, lease: float = 60.0, **fields: Any
) -> Job:
    """Enqueue one job (in a fresh queue unless one is given) and claim it."""
    queue = fields.pop("queue", None) or fresh_queue()
    job = await enqueue_one(store, queue=queue, **fields)
    claimed = await claim_one(store, worker, queue=queue, task=job.task, lease=lease)
    assert claimed.id == job.id
    return claimed


def outcome(job: Job, state: JobState, **fields: Any) -> Outcome:
    """An outcome for ``job`` carrying the token it was claimed with."""
    return Outcome(job_id=job.id, lease_token=job.lease_token, state=state, **fields)


def unnumbered(events: Sequence[JobEvent]) -> list[JobEvent]:
    """``events`` without their ids: a transition read off a job's row has none until it
    is stored (migration 0028), and the same history reads the same either way."""
    return [dataclasses.replace(e, id=None) for e in events]
