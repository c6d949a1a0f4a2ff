"""The embedded store: one SQLite file in WAL mode.

All statements of one store run on one dedicated thread with one connection, so the
event loop never blocks on disk. Writes are short ``BEGIN IMMEDIATE`` transactions,
which serialize writers across processes on the same file; readers never wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import sqlite3
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from tether import hints as h
from tether.errors import InvalidJobError, JobNotFoundError, StoreError
from tether.hints import Hints
from tether.job import (
    CancellationRow,
    FeedEvent,
    Job,
    JobEvent,
    JobFilter,
    LimitInfo,
    NewJob,
    Outcome,
    QueueInfo,
    RateLimitInfo,
    WorkerInfo,
)
from tether.ops import LeaderInfo, PruneBatch, ScheduleRow
from tether.procinfo import PidSpace, pid_space
from tether.states import TERMINAL
from tether.store.admission import admit
from tether.store.api_rows import ApiRowReader
from tether.store.base import ProcessGone, check_dependencies, load_migrations
from tether.store.common import SqlStore
from tether.store.driver import Body, Tx, run_inline
from tether.store.rows import (
    CANCEL_STATE,
    CANCELLABLE_SQL,
    JOB_COLUMNS,
    RESCUE_STATE,
    RowReader,
    epoch_to_dt,
    worker_process,
)
from tether.store.sql import sqlite as sqlite_sql
from tether.store.sql.sqlite.fragments import RATE_TOKENS
from tether.store.sqlite_tx import SqliteTx
from tether.store.sqlite_workflow import propagate

T = TypeVar("T")

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL))
EACH = "(SELECT value FROM json_each(?))"
LIVE_SQL = "'queued', 'blocked', 'running', 'retrying', 'paused'"
HAS_CHILDREN = "EXISTS (SELECT 1 FROM tether_jobs c WHERE c.parent_id = tether_jobs.id)"
# How often a listening store checks for other processes' commits.
WATCH_INTERVAL = 0.1
# SQLite's default limit on bound parameters is 32766; stay well below it.
CHUNK = 500
# A bulk enqueue commits this many jobs per transaction, so it never holds the write
# lock for long (about 0.1 s here); between chunks other writers, heartbeats above all,
# take their turn. Its jobs are claimable only once the last chunk has committed.
BULK_CHUNK = 1000
# The pause after each chunk: a window for a writer of another process, waiting for the
# lock, to take it (see LOCK_POLL).
BULK_PAUSE = 0.01
# How often a writer waiting for the lock tries again. SQLite's own busy handler backs
# off to 100 ms sleeps and would keep missing the short pauses of a bulk enqueue.
LOCK_POLL = 0.001
# Never longer than BULK_PAUSE, or a waiter could sleep through every pause of a bulk.
LOCK_POLL_MAX = 0.008
# A bulk whose producer has committed nothing for this long is abandoned (its process
# died half-way): the rescue deletes its jobs.
BULK_ABANDONED_AFTER = 60.0
OPEN_BATCH = "SELECT 1 FROM tether_open_batches WHERE id = ?"
# A job of another bulk enqueue still in progress (the parameter: this enqueue's own
# batch, or NULL): it may yet be deleted with its bulk.
UNCOMMITTED = (
    "(batch IS NOT NULL AND batch IS NOT ? AND batch IN (SELECT id FROM tether_open_batches))"
)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _tuples(conn: sqlite3.Connection) -> sqlite3.Cursor:
    """A cursor of ``conn`` whose rows are plain tuples, for the hot paths (a row
    looked up by column name costs a scan of the names)."""
    cur = conn.cursor()
    cur.row_factory = None
    return cur


class SqliteStore(SqlStore):
    """A :class:`~tether.store.base.Store` on one SQLite file."""

    dialect = "sqlite"
    sql = sqlite_sql
    _api = ApiRowReader(RowReader(text_json=True, epoch_times=True), epoch_times=True)

    def __init__(
        self, url: str, path: str, *, busy_timeout: float = 30.0, synchronous: str = "normal"
    ) -> None:
        self.url = url
        self.path = path
        # One of "normal", "full", "extra" (validated by the URL parser).
        self._synchronous = synchronous
        self.hints = Hints()
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._rows = RowReader(text_json=True, epoch_times=True)
        self._watcher: asyncio.Task[None] | None = None
        self._memory: MemoryDatabase | None = None

    # -- plumbing ------------------------------------------------------------------------

    async def open(self) -> None:
        if self._executor is None:
            if "mode=memory" in self.path:
                memory = _MEMORY.get(self.path)
                if memory is None:
                    raise StoreError(f"the in-memory database {self.path} is gone with its App")
                # Every store of an in-memory database shares its one connection and
                # thread: SQLite's shared-cache locks would fail at once, not wait.
                self._executor, self._conn, self._memory = memory.executor, memory.conn, memory
                return
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="tether-sqlite")
            await self._call(self._connect)

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(BaseException):
                await self._watcher
            self._watcher = None
        if self._memory is not None:
            self._executor, self._conn, self._memory = None, None, None
            return  # the database's connection lives as long as its App
        executor, self._executor = self._executor, None
        if executor is None:
            return

        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(executor, shut)
        executor.shutdown(wait=True)

    def _connect(self) -> None:
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            uri=self.path.startswith("file:"),
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")
        self._conn = conn

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            await self.open()
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, functools.partial(fn, *args))
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite ({self.path}): {exc}") from exc

    def _db(self) -> sqlite3.Connection:
        assert self._conn is not None, "store is not open"
        return self._conn

    def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, waiting up to the busy timeout for the write lock, and
        trying again after ``LOCK_POLL``, doubling up to ``LOCK_POLL_MAX`` seconds."""
        deadline = time.monotonic() + self._busy_timeout
        conn.execute("PRAGMA busy_timeout = 0")
        pause = LOCK_POLL
        try:
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    busy = exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
                    if not busy or time.monotonic() >= deadline:
                        raise
                time.sleep(pause)
                # Fast at first (a bulk enqueue's pauses are short), then gentler, so
                # many waiting processes do not spin on the lock.
                pause = min(pause * 2, LOCK_POLL_MAX)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._db()
        self._begin(conn)
        try:
            out = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return out

    async def _write_async(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._call(self._write, fn)

    async def _query(self, body: Body[T]) -> T:
        def run() -> tuple[T, SqliteTx]:
            tx = SqliteTx(self._db())
            return run_inline(body(tx)), tx

        out, tx = await self._call(run)
        tx.announce(self.hints)
        return out

    async def _change(self, body: Body[T]) -> T:
        return await self._transact(body)

    async def _transact(self, body: Body[T]) -> T:
        def run(conn: sqlite3.Connection) -> tuple[T, SqliteTx]:
            tx = SqliteTx(conn)
            return run_inline(body(tx)), tx

        out, tx = await self._write_async(run)
        tx.announce(self.hints)
        return out

    def _jobs_by_ids(self, conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, Job]:
        found: dict[int, Job] = {}
        for i in range(0, len(ids), CHUNK):
            part = ids[i : i + CHUNK]
            sql = f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id IN ({_marks(len(part))})"
            for row in _tuples(conn).execute(sql, part):
                job = self._rows.job_from_tuple(row)
                found[job.id] = job
        return found

    # -- schema --------------------------------------------------------------------------

    async def schema_version(self) -> int:
        def read(conn: sqlite3.Connection) -> int:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='tether_migrations'"
            ).fetchone()
            if not exists:
                return 0
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM tether_migrations").fetchone()
            return int(row[0])

        return await self._call(lambda: read(self._db()))

    async def applied_migrations(self) -> set[int]:
        def read(conn: sqlite3.Connection) -> set[int]:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='tether_migrations'"
            ).fetchone()
            if not exists:
                return set()
            return {int(r[0]) for r in conn.execute("SELECT version FROM tether_migrations")}

        return await self._call(lambda: read(self._db()))

    async def migrate(self) -> list[int]:
        def run(conn: sqlite3.Connection) -> list[int]:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS tether_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM tether_migrations")}
            applied = []
            for mig in load_migrations("sqlite"):
                if mig.version in done:
                    continue
                # executescript would COMMIT our transaction; run statement by statement.
                for statement in _split_sql(mig.sql):
                    conn.execute(statement)
                conn.execute(
                    f"INSERT INTO tether_migrations VALUES (?, ?, {NOW})", (mig.version, mig.name)
                )
                applied.append(mig.version)
            return applied

        return await self._write_async(run)

    # -- producers and readers -----------------------------------------------------------

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Job]:
        if len(jobs) <= BULK_CHUNK:
            out = await self._write_async(functools.partial(self._insert_jobs, jobs, [], None))
        else:
            out = await self._enqueue_in_chunks(jobs)
        self.hints.publish(h.ENQUEUED, {job.queue for job in out})
        return out

    async def _enqueue_in_chunks(self, jobs: Sequence[NewJob]) -> list[Job]:
        """All or nothing, in short transactions: the jobs go in chunk by chunk, marked
        with a batch that keeps them from being claimed until the last, tiny transaction
        closes it; a failure deletes every job of the batch."""
        batch = f"bulk-{secrets.token_hex(8)}"
        await self._write_async(
            lambda conn: conn.execute(
                f"INSERT INTO tether_open_batches (id, touched_at) VALUES (?, {NOW})", (batch,)
            )
        )
        ids: list[int] = []
        out: list[Job] = []
        try:
            for i in range(0, len(jobs), BULK_CHUNK):
                if i:
                    await asyncio.sleep(BULK_PAUSE)
                part = jobs[i : i + BULK_CHUNK]
                out += await self._write_async(
                    functools.partial(self._insert_jobs, part, ids, batch)
                )
            closed = await self._write_async(
                lambda conn: (
                    conn.execute("DELETE FROM tether_open_batches WHERE id = ?", (batch,)).rowcount
                )
            )
            if not closed:
                raise StoreError("bulk enqueue abandoned: it stalled too long between chunks")
        except BaseException:
            # Shielded: a cancelled enqueue still removes what it wrote.
            await asyncio.shield(self._discard_batch(batch))
            raise
        return out

    def _abandoned_batches(self) -> list[str]:
        rows = self._db().execute(
            f"SELECT id FROM tether_open_batches WHERE touched_at < {NOW} - ?",
            (BULK_ABANDONED_AFTER,),
        )
        return [r[0] for r in rows]

    async def _discard_batch(self, batch: str) -> None:
        """Delete an open batch's jobs, in short transactions, then the batch."""
        while await self._write_async(functools.partial(self._discard_chunk, batch)):
            pass

    def _discard_chunk(self, batch: str, conn: sqlite3.Connection) -> bool:
        """Delete up to a chunk of an open batch's jobs; ``False`` once none is left
        (the batch is closed then). A closed batch is never touched: its jobs are real."""
        if conn.execute(OPEN_BATCH, (batch,)).fetchone() is None:
            return False
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM tether_jobs WHERE batch = ? LIMIT ?", (batch, BULK_CHUNK)
            )
        ]
        if not ids:
            conn.execute("DELETE FROM tether_open_batches WHERE id = ?", (batch,))
            return False
        for table, column in (
            ("tether_job_events", "job_id"),
            ("tether_dependencies", "job_id"),
            ("tether_jobs", "id"),
        ):
            conn.execute(f"DELETE FROM {table} WHERE {column} IN {EACH}", (json.dumps(ids),))
        return True

    def _insert_jobs(
        self,
        jobs: Sequence[NewJob],
        ids: list[int],
        batch: str | None,
        conn: sqlite3.Connection,
    ) -> list[Job]:
        """Insert ``jobs`` (``ids``: the ids of the batch's earlier chunks, extended)."""
        if (
            batch is not None
            and not conn.execute(
                f"UPDATE tether_open_batches SET touched_at = {NOW} WHERE id = ?", (batch,)
            ).rowcount
        ):
            raise StoreError("bulk enqueue abandoned: it stalled too long between chunks")
        start = len(ids)
        keys = sorted({j.idempotency_key for j in jobs if j.idempotency_key is not None})
        if keys:
            # A key whose uniqueness window has passed is let go by its old job.
            conn.execute(
                "UPDATE tether_jobs SET idempotency_key = NULL "
                f"WHERE idempotency_key IN {EACH} AND idempotency_expires_at <= {NOW}",
                (json.dumps(keys),),
            )
        for job in jobs:
            # A known idempotency key answers first: the existing job, whatever the rest
            # of this request says (its dependencies are not checked again).
            if job.idempotency_key is not None:
                row = conn.execute(
                    f"SELECT id, {UNCOMMITTED} AS pending FROM tether_jobs "
                    "WHERE idempotency_key = ?",
                    (batch, job.idempotency_key),
                ).fetchone()
                if row is not None and row[1]:
                    # Its job may yet be deleted with its bulk: no answer to give now.
                    raise StoreError(
                        f"idempotency key {job.idempotency_key!r} is being written by a bulk "
                        "enqueue still in progress; try again"
                    )
                if row is not None:
                    ids.append(row[0])
                    continue
            deps = sorted({*job.depends_on, *(ids[i] for i in job.depends_on_batch)})
            state = "queued"
            if deps:
                # A job of another bulk still being written is not there yet: depending
                # on it would leave a dangling link if that bulk failed.
                found = {
                    r[0]: r[1]
                    for r in conn.execute(
                        f"SELECT id, state FROM tether_jobs WHERE id IN ({_marks(len(deps))}) "
                        f"AND NOT {UNCOMMITTED}",
                        [*deps, batch],
                    )
                }
                check_dependencies(deps, found)
                if any(st != "succeeded" for st in found.values()):
                    state = "blocked"
            row = conn.execute(
                "INSERT INTO tether_jobs (task, args, queue, priority, key, state, "
                "max_attempts, timeout, run_at, created_at, owner, idempotency_key, actor, "
                "budget, limits, parent_id, batch, idempotency_expires_at) "
                f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?, {NOW} + ?), {NOW}, ?, ?, "
                f"'enqueue', ?, ?, ?, ?, {NOW} + ?) RETURNING id",
                (
                    job.task,
                    job.args_json,
                    job.queue,
                    job.priority,
                    job.key,
                    state,
                    job.max_attempts,
                    job.timeout,
                    None if job.run_at is None else job.run_at.timestamp(),
                    job.delay,
                    job.owner,
                    job.idempotency_key,
                    job.budget,
                    json.dumps(job.limits) if job.limits else None,
                    job.parent_id,
                    batch,
                    job.unique_for,
                ),
            ).fetchone()
            ids.append(row[0])
            conn.executemany(
                "INSERT INTO tether_dependencies (job_id, depends_on) VALUES (?, ?)",
                [(row[0], d) for d in deps],
            )
            if deps:
                conn.execute(
                    f"UPDATE tether_jobs SET has_dependents = 1 WHERE id IN {EACH}",
                    (json.dumps(deps),),
                )
        found = self._jobs_by_ids(conn, ids[start:])
        return [found[i] for i in ids[start:]]

    async def get(self, job_id: int) -> Job | None:
        return (await self._call(lambda: self._jobs_by_ids(self._db(), [job_id]))).get(job_id)

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        where: list[str] = ["1=1"]
        params: list[str] = []
        if flt.states is not None:
            where.append(f"state IN ({_marks(len(flt.states))})")
            params.extend(s.value for s in flt.states)
        for column in ("queue", "task", "key", "owner", "worker_id", "parent_id"):
            value = getattr(flt, column)
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if flt.ids is not None:
            where.append(f"id IN ({_marks(len(flt.ids))})")
            params.extend(str(i) for i in flt.ids)
        sql = (
            f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE {' AND '.join(where)} "
            "ORDER BY id DESC LIMIT ? OFFSET ?"
        )
        params.extend([str(flt.limit), str(flt.offset)])

        def run() -> list[Job]:
            return [self._rows.job(r) for r in self._db().execute(sql, params)]

        return await self._call(run)

    async def count_by_state(self) -> dict[str, int]:
        def run() -> dict[str, int]:
            rows = self._db().execute("SELECT state, COUNT(*) FROM tether_jobs GROUP BY state")
            return {r[0]: r[1] for r in rows}

        return await self._call(run)

    async def events(self, job_id: int) -> list[JobEvent]:
        def run() -> list[JobEvent]:
            rows = self._db().execute(
                "SELECT * FROM tether_job_events WHERE job_id = ? ORDER BY id", (job_id,)
            )
            return [self._rows.event(r) for r in rows]

        return await self._call(run)

    async def request_cancel(
        self,
        job_id: int,
        reason: str | None,
        force: bool,
        actor: str | None,
        cascade: bool = True,
    ) -> Job:
        def run(conn: sqlite3.Connection) -> Job:
            row = conn.execute(
                f"UPDATE tether_jobs SET state = {CANCEL_STATE}, "
                f"finished_at = CASE WHEN state = 'running' THEN finished_at ELSE {NOW} END, "
                f"cancel_requested_at = COALESCE(cancel_requested_at, {NOW}), "
                "cancel_reason = COALESCE(cancel_reason, ?), "
                "cancel_force = cancel_force OR ?, actor = ?, reason = ?, cancel_cascade = ? "
                f"WHERE id = ? AND state IN ({CANCELLABLE_SQL}) RETURNING state",
                (reason, force, actor, reason, cascade, job_id),
            ).fetchone()
            if row is not None and row[0] != "running":
                self._propagate(conn, [job_id])
            return self._one(conn, job_id)

        job = await self._write_async(run)
        if job.state == "running":
            self.hints.publish(h.CANCEL, [str(job_id)])
        return job

    async def request_pause(self, job_id: int, reason: str | None, actor: str | None) -> Job:
        def run(conn: sqlite3.Connection) -> Job:
            conn.execute(
                "UPDATE tether_jobs SET "
                "state = CASE WHEN state = 'running' THEN state ELSE 'paused' END, "
                f"pause_requested_at = COALESCE(pause_requested_at, {NOW}), "
                "pause_reason = COALESCE(?, pause_reason), actor = ?, reason = ? "
                "WHERE id = ? AND state IN ('queued', 'retrying', 'running')",
                (reason, actor, reason or "paused", job_id),
            )
            return self._one(conn, job_id)

        job = await self._write_async(run)
        self.hints.publish(h.CONTROL if job.state == "running" else h.CHANGED, [str(job_id)])
        return job

    async def resume(self, job_id: int, budget: int | None, actor: str | None) -> Job:
        def run(conn: sqlite3.Connection) -> Job:
            conn.execute(
                "UPDATE tether_jobs SET "
                "state = CASE WHEN state = 'paused' THEN 'queued' ELSE state END, "
                f"run_at = CASE WHEN state = 'paused' THEN {NOW} ELSE run_at END, "
                "pause_requested_at = NULL, pause_reason = NULL, "
                "budget = COALESCE(?, budget), actor = ?, reason = 'resumed' "
                "WHERE id = ? AND (state = 'paused' OR "
                "(state = 'running' AND pause_requested_at IS NOT NULL))",
                (budget, actor, job_id),
            )
            return self._one(conn, job_id)

        job = await self._write_async(run)
        self.hints.publish(h.CHANGED, [str(job_id)])
        self.hints.publish(h.ENQUEUED, [job.queue])
        return job

    async def retry(self, job_id: int, actor: str | None) -> Job:
        def run(conn: sqlite3.Connection) -> Job:
            conn.execute(
                f"UPDATE tether_jobs SET state = 'queued', attempt = 0, run_at = {NOW}, "
                "finished_at = NULL, cancel_requested_at = NULL, cancel_reason = NULL, "
                "cancel_force = 0, pause_requested_at = NULL, pause_reason = NULL, "
                "actor = ?, reason = 'retried by a person' "
                "WHERE id = ? AND state = 'failed'",
                (actor, job_id),
            )
            return self._one(conn, job_id)

        job = await self._write_async(run)
        self.hints.publish(h.CHANGED, [str(job_id)])
        self.hints.publish(h.ENQUEUED, [job.queue])
        return job

    def _one(self, conn: sqlite3.Connection, job_id: int) -> Job:
        job = self._jobs_by_ids(conn, [job_id]).get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return job

    # -- queues, limits, artifacts, cancellations ----------------------------------------

    async def set_queue_paused(self, name: str, paused: bool, reason: str | None) -> None:
        await self._write_async(
            lambda conn: conn.execute(
                f"INSERT INTO tether_queues (name, paused, reason, changed_at) "
                f"VALUES (?, ?, ?, {NOW}) ON CONFLICT (name) DO UPDATE SET "
                f"paused = excluded.paused, reason = excluded.reason, changed_at = {NOW}",
                (name, paused, reason),
            )
        )
        if not paused:
            self.hints.publish(h.ENQUEUED, [name])

    async def list_queues(self) -> list[QueueInfo]:
        def run() -> list[QueueInfo]:
            conn = self._db()
            counts: dict[str, dict[str, int]] = {}
            for r in conn.execute("SELECT queue, state, COUNT(*) FROM tether_jobs GROUP BY 1, 2"):
                counts.setdefault(r[0], {})[r[1]] = r[2]
            flags = {
                r[0]: (bool(r[1]), r[2])
                for r in conn.execute("SELECT name, paused, reason FROM tether_queues")
            }
            return [
                QueueInfo(name, *flags.get(name, (False, None)), counts.get(name, {}))
                for name in sorted(set(counts) | set(flags))
            ]

        return await self._call(run)

    async def define_limit(self, name: str, kind: str, capacity: int, block_on_hold: bool) -> None:
        await self._write_async(
            lambda conn: conn.execute(
                "INSERT INTO tether_limits (name, kind, capacity, block_on_hold) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "capacity = excluded.capacity, block_on_hold = excluded.block_on_hold",
                (name, kind, capacity, block_on_hold),
            )
        )
        self.hints.publish(h.ENQUEUED, [h.ANY])

    async def list_limits(self) -> list[LimitInfo]:
        def run() -> list[LimitInfo]:
            rows = self._db().execute(
                "SELECT l.*, (SELECT COUNT(*) FROM tether_jobs j WHERE j.key IS NOT NULL "
                "AND 'key:' || j.key = l.name AND j.state IN ('queued', 'retrying')) AS queued "
                "FROM tether_limits l ORDER BY l.name"
            )
            return [self._rows.limit(r) for r in rows]

        return await self._call(run)

    async def waiting_by_task(self) -> dict[tuple[str, str], int]:
        def run() -> dict[tuple[str, str], int]:
            rows = self._db().execute(
                "SELECT queue, task, COUNT(*) FROM tether_jobs "
                "WHERE state IN ('queued', 'retrying') GROUP BY 1, 2"
            )
            return {(r[0], r[1]): r[2] for r in rows}

        return await self._call(run)

    async def set_rate_limit(self, scope: str, name: str, per_second: float, burst: int) -> None:
        await self._write_async(
            lambda conn: conn.execute(
                "INSERT INTO tether_rate_limits (id, per_second, burst, tokens, refilled_at) "
                f"VALUES (?, ?, ?, ?, {NOW}) ON CONFLICT (id) DO UPDATE SET "
                "per_second = excluded.per_second, burst = excluded.burst, "
                "tokens = excluded.tokens, refilled_at = excluded.refilled_at",
                (f"{scope}:{name}", per_second, burst, burst),
            )
        )
        self.hints.publish(h.ENQUEUED, [h.ANY])

    async def remove_rate_limit(self, scope: str, name: str) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM tether_rate_limits WHERE id = ?", (f"{scope}:{name}",))
            return cur.rowcount > 0

        removed = await self._write_async(run)
        self.hints.publish(h.ENQUEUED, [h.ANY])
        return removed

    async def list_rate_limits(self) -> list[RateLimitInfo]:
        def run() -> list[RateLimitInfo]:
            rows = self._db().execute(
                f"SELECT id, per_second, burst, {RATE_TOKENS} FROM tether_rate_limits ORDER BY id"
            )
            return [_rate_limit(r[0], r[1], r[2], r[3]) for r in rows]

        return await self._call(run)

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
        def run(conn: sqlite3.Connection) -> tuple[CancellationRow, bool]:
            cur = conn.execute(
                "INSERT INTO tether_cancellations (id, job_id, request_id, reason, force, "
                f"cascade, initiated_by, initiated_at, status) VALUES (?, ?, ?, ?, ?, ?, ?, "
                f"{NOW}, 'initiated') ON CONFLICT DO NOTHING",
                (cancellation_id, job_id, request_id, reason, force, cascade, initiated_by),
            )
            row = conn.execute(
                "SELECT * FROM tether_cancellations WHERE job_id = ? OR "
                "(? IS NOT NULL AND request_id = ?) ORDER BY id = ? DESC, "
                "status NOT IN ('completed', 'partial', 'failed') DESC, "
                "initiated_at DESC LIMIT 1",
                (job_id, request_id, request_id, cancellation_id),
            ).fetchone()
            return self._rows.cancellation(row), cur.rowcount == 1

        return await self._write_async(run)

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
        def run(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "UPDATE tether_cancellations SET status = ?, steps = ?, "
                "result = COALESCE(?, result), error = ?, "
                f"completed_at = CASE WHEN ? THEN {NOW} ELSE completed_at END "
                "WHERE id = ? AND (? IS NULL OR status = ?) RETURNING job_id",
                (
                    status,
                    json.dumps(steps),
                    json.dumps(result) if result is not None else None,
                    error,
                    final,
                    cancellation_id,
                    expect,
                    expect,
                ),
            ).fetchone()
            return int(row[0]) if row is not None else None

        job_id = await self._write_async(run)
        if job_id is None:
            return False
        self.hints.publish(h.CHANGED, [str(job_id)])
        return True

    async def get_cancellation(
        self, *, job_id: int | None, request_id: str | None
    ) -> CancellationRow | None:
        def run() -> CancellationRow | None:
            row = (
                self._db()
                .execute(
                    "SELECT * FROM tether_cancellations WHERE job_id = ? OR "
                    "(? IS NOT NULL AND request_id = ?) ORDER BY initiated_at DESC LIMIT 1",
                    (job_id, request_id, request_id),
                )
                .fetchone()
            )
            return self._rows.cancellation(row) if row else None

        return await self._call(run)

    async def list_cancellations(
        self, limit: int, offset: int, status: str | None = None
    ) -> list[CancellationRow]:
        def run() -> list[CancellationRow]:
            # Two statements, not one with an OR: the filtered one uses the partial index.
            if status is None:
                rows = self._db().execute(
                    "SELECT * FROM tether_cancellations ORDER BY initiated_at DESC, id "
                    "LIMIT ? OFFSET ?",
                    (limit, offset),
                )
            else:
                rows = self._db().execute(
                    "SELECT * FROM tether_cancellations WHERE status = ? "
                    "ORDER BY initiated_at DESC, id LIMIT ? OFFSET ?",
                    (status, limit, offset),
                )
            return [self._rows.cancellation(r) for r in rows]

        return await self._call(run)

    async def list_stale_cancellations(
        self, older_than: float, limit: int
    ) -> list[CancellationRow]:
        def run() -> list[CancellationRow]:
            rows = self._db().execute(
                "SELECT * FROM tether_cancellations "
                "WHERE status NOT IN ('completed', 'partial', 'failed') "
                f"AND initiated_at <= {NOW} - ? ORDER BY initiated_at, id LIMIT ?",
                (older_than, limit),
            )
            return [self._rows.cancellation(r) for r in rows]

        return await self._call(run)

    # -- workers -------------------------------------------------------------------------

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
        space = pid_space() if space is None else space
        await self._write_async(
            lambda conn: conn.execute(
                "INSERT INTO tether_workers (id, name, host, pid, pid_start, boot_id, pid_ns, "
                "machine_id, queues, concurrency, started_at, heartbeat_at, state, tasks) "
                f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {NOW}, {NOW}, 'active', ?)",
                (
                    worker_id,
                    name,
                    host,
                    pid,
                    pid_start,
                    space.boot_id,
                    space.pid_ns,
                    space.machine_id,
                    ",".join(queues),
                    concurrency,
                    json.dumps(sorted(tasks)) if tasks is not None else None,
                ),
            )
        )

    async def set_worker_state(self, worker_id: str, state: str) -> None:
        await self._write_async(
            lambda conn: conn.execute(
                f"UPDATE tether_workers SET state = ?, heartbeat_at = {NOW} WHERE id = ?",
                (state, worker_id),
            )
        )

    async def set_worker_threads(self, worker_id: str, abandoned: int, pool_full: bool) -> None:
        await self._write_async(
            lambda conn: conn.execute(
                "UPDATE tether_workers SET abandoned_threads = ?, thread_pool_full = ? "
                "WHERE id = ?",
                (abandoned, int(pool_full), worker_id),
            )
        )

    async def list_workers(self) -> list[WorkerInfo]:
        def run() -> list[WorkerInfo]:
            rows = self._db().execute(
                "SELECT w.*, (SELECT COUNT(*) FROM tether_jobs j WHERE j.state = 'running' "
                "AND j.worker_id = w.id) AS running_jobs FROM tether_workers w "
                "ORDER BY w.started_at DESC"
            )
            return [self._rows.worker(r) for r in rows]

        return await self._call(run)

    # -- leases (see tether.store.common.leases) -----------------------------------------

    async def _claim(self, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        # The dialect's own claim: a look first, and limit admission in Python under the
        # write lock (tether.store.admission: why PostgreSQL does it in SQL instead).
        q = self.sql.leases
        queues, tasks = params["queues"], params["tasks"]
        args = {**params, **q.claim_names(queues, tasks)}
        del args["queues"], args["tasks"]
        ready = q.claim_ready(len(queues), len(tasks))

        def run() -> list[tuple[Any, ...]]:
            # Look before taking the write lock: an idle poll must not serialize writers.
            if run_inline(SqliteTx(self._db()).one(ready, args)) is None:
                return []
            candidates = q.claim_candidates(len(queues), len(tasks))
            return self._write(lambda conn: run_inline(_take(SqliteTx(conn), candidates, args)))

        # One hop to the store thread, for the look and the claim both.
        return await self._call(run)

    async def _after_finish(self, tx: Tx, outcomes: Sequence[Outcome]) -> None:
        # No trigger here to announce jobs waiting again (see LeasesSql._after_finish).
        if any(o.state.value in ("queued", "retrying") for o in outcomes):
            await tx.notify(h.ENQUEUED, [h.ANY])

    # -- maintenance ---------------------------------------------------------------------

    async def mark_dead_workers(self, process_gone: ProcessGone, session_grace: float) -> list[str]:
        # No sessions to look at on SQLite: a worker elsewhere is judged by lease expiry.
        def run(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT id, pid, pid_start, boot_id, pid_ns, machine_id FROM tether_workers "
                "WHERE state IN ('active', 'draining')"
            ).fetchall()
            dead = [r["id"] for r in rows if process_gone(worker_process(r))]
            for worker_id in dead:
                conn.execute("UPDATE tether_workers SET state = 'dead' WHERE id = ?", (worker_id,))
            return dead

        return await self._write_async(run)

    async def rescue(self) -> list[Job]:
        # A bulk enqueue whose process died half-way: its jobs were never claimable;
        # delete them, as its producer would have on failure.
        for batch in await self._call(self._abandoned_batches):
            await self._discard_batch(batch)

        def run(conn: sqlite3.Connection) -> list[Job]:
            rows = conn.execute(
                f"UPDATE tether_jobs SET state = {RESCUE_STATE}, "
                "lease_token = lease_token + 1, lease_expires_at = NULL, "
                # Recovered work that has a checkpoint goes first: back to its place in line.
                # Other recovered work goes to the back of the line: behind every job
                # already waiting, even one enqueued within the same tick of the clock
                # (SQLite's clock counts milliseconds), so the order never rests on timing.
                f"run_at = CASE WHEN checkpoint IS NOT NULL THEN MIN(run_at, created_at) "
                f"ELSE MAX({NOW}, COALESCE((SELECT MAX(w.run_at) FROM tether_jobs w "
                f"WHERE w.state IN ('queued', 'retrying') AND w.run_at <= {NOW}), 0) + 0.001) "
                "END, "
                f"finished_at = CASE WHEN {RESCUE_STATE} IN ({TERMINAL_SQL}) THEN {NOW} "
                "ELSE NULL END, "
                "error = 'worker ' || COALESCE(worker_id, '?') || ' lost its lease (attempt ' "
                "|| attempt || '/' || max_attempts || ')', actor = 'rescuer', "
                "reason = CASE WHEN cancel_requested_at IS NOT NULL "
                "THEN 'rescued with a pending cancel' "
                "WHEN pause_requested_at IS NOT NULL THEN 'rescued with a pending pause' "
                "WHEN worker_id IN (SELECT id FROM tether_workers WHERE state = 'dead') "
                "THEN 'worker dead' ELSE 'lease expired' END "
                f"|| CASE WHEN phase IS NULL THEN '' WHEN {HAS_CHILDREN} "
                "THEN '; staying in phase ' || phase || ' (' || (SELECT COUNT(*) FROM "
                "tether_jobs c WHERE c.parent_id = tether_jobs.id) || ' children found)' "
                "ELSE '; reset to the ingest phase (no children found)' END, "
                # Smart phase recovery: a later phase without children (the crash came
                # between the phase change and the spawns) starts again from the first.
                f"phase = CASE WHEN phase IS NOT NULL AND NOT {HAS_CHILDREN} THEN NULL "
                "ELSE phase END "
                f"WHERE state = 'running' AND (lease_expires_at < {NOW} OR worker_id IN "
                "(SELECT id FROM tether_workers WHERE state = 'dead')) "
                f"RETURNING {JOB_COLUMNS}"
            ).fetchall()
            jobs = [self._rows.job(r) for r in rows]
            self._propagate(conn, [j.id for j in jobs])
            return jobs

        rescued = await self._write_async(run)
        if rescued:
            self.hints.publish(h.ENQUEUED, [h.ANY])
        return rescued

    # -- workflows -----------------------------------------------------------------------

    async def _after_transitions(self, tx: Tx, changed: list[int]) -> None:
        await propagate(tx, changed)

    def _propagate(self, conn: sqlite3.Connection, changed: list[int]) -> None:
        """The old synchronous entry, for code not yet written over a Tx."""
        tx = SqliteTx(conn)
        run_inline(propagate(tx, changed))
        tx.announce(self.hints)

    async def spawn(self, parent_id: int, lease_token: int, job: NewJob) -> Job | None:
        def run(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(
                "INSERT INTO tether_jobs (task, args, queue, priority, key, state, max_attempts, "
                "timeout, run_at, created_at, owner, idempotency_key, actor, budget, limits, "
                f"parent_id) SELECT ?, ?, ?, ?, ?, 'queued', ?, ?, {NOW} + ?, {NOW}, p.owner, "
                "?, 'spawn', ?, ?, p.id FROM tether_jobs p WHERE p.id = ? AND "
                "p.lease_token = ? AND p.state = 'running' AND p.cancel_requested_at IS NULL "
                "RETURNING id",
                (
                    job.task,
                    job.args_json,
                    job.queue,
                    job.priority,
                    job.key,
                    job.max_attempts,
                    job.timeout,
                    job.delay,
                    job.idempotency_key,
                    job.budget,
                    json.dumps(job.limits) if job.limits else None,
                    parent_id,
                    lease_token,
                ),
            ).fetchone()
            if row is None:
                return None
            conn.execute("UPDATE tether_jobs SET has_children = 1 WHERE id = ?", (parent_id,))
            return self._one(conn, row[0])

        child = await self._write_async(run)
        if child is not None:
            self.hints.publish(h.ENQUEUED, [child.queue])
        return child

    async def delete(self, job_id: int, actor: str | None) -> tuple[Job, list[Job]]:
        def run(conn: sqlite3.Connection) -> tuple[Job, list[Job]]:
            job = self._one(conn, job_id)
            children = [
                r[0]
                for r in conn.execute(
                    "UPDATE tether_jobs SET state = 'cancelled', "
                    f"cancel_requested_at = COALESCE(cancel_requested_at, {NOW}), "
                    "cancel_reason = COALESCE(cancel_reason, 'parent job deleted'), "
                    "lease_token = lease_token + (state = 'running'), lease_expires_at = NULL, "
                    f"finished_at = {NOW}, actor = ?, reason = 'parent job deleted' "
                    f"WHERE parent_id = ? AND state IN ({LIVE_SQL}) RETURNING id",
                    (actor, job_id),
                )
            ]
            # Settle the job itself first, so counters and dependents see it end.
            conn.execute(
                "UPDATE tether_jobs SET state = 'cancelled', "
                f"cancel_requested_at = COALESCE(cancel_requested_at, {NOW}), "
                "cancel_reason = COALESCE(cancel_reason, 'job deleted'), "
                "lease_token = lease_token + (state = 'running'), lease_expires_at = NULL, "
                f"finished_at = {NOW}, actor = ?, reason = 'job deleted' "
                f"WHERE id = ? AND state IN ({CANCELLABLE_SQL})",
                (actor, job_id),
            )
            self._propagate(conn, [*children, job_id])
            conn.execute("DELETE FROM tether_dependencies WHERE job_id = ?", (job_id,))
            conn.execute("DELETE FROM tether_artifacts WHERE job_id = ?", (job_id,))
            conn.execute("DELETE FROM tether_jobs WHERE id = ?", (job_id,))
            found = self._jobs_by_ids(conn, children)
            return job, [found[i] for i in children]

        return await self._write_async(run)

    async def downstream(self, job_ids: Sequence[int]) -> list[Job]:
        def run() -> list[Job]:
            rows = self._db().execute(
                "WITH RECURSIVE reach(id) AS (SELECT value FROM json_each(?) "
                "UNION SELECT d.job_id FROM tether_dependencies d JOIN reach r "
                "ON d.depends_on = r.id "
                "UNION SELECT c.id FROM tether_jobs c JOIN reach r ON c.parent_id = r.id) "
                f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id IN (SELECT id FROM reach) "
                "AND id NOT IN (SELECT value FROM json_each(?)) ORDER BY id",
                (json.dumps(list(job_ids)), json.dumps(list(job_ids))),
            )
            return [self._rows.job(r) for r in rows]

        return await self._call(run)

    async def dependencies(self, job_id: int) -> tuple[list[int], list[int]]:
        def run() -> tuple[list[int], list[int]]:
            conn = self._db()
            up = conn.execute(
                "SELECT depends_on FROM tether_dependencies WHERE job_id = ? ORDER BY 1", (job_id,)
            )
            down = conn.execute(
                "SELECT job_id FROM tether_dependencies WHERE depends_on = ? ORDER BY 1", (job_id,)
            )
            return [r[0] for r in up], [r[0] for r in down]

        return await self._call(run)

    async def listen(self) -> None:
        """Watch for other processes' commits, as NOTIFY does on PostgreSQL.

        SQLite has no notifications. ``PRAGMA data_version`` changes when another
        connection commits, so a cheap poll of it turns their enqueues, cancel and pause
        requests into local hints: a worker hears of a cancel in about 0.1 s instead of
        at its next heartbeat. (This process's own writes publish hints directly.)
        """
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch(), name="tether-sqlite-watch")

    async def _watch(self) -> None:
        seen: int | None = None
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            try:
                seen, changed, cancels, pauses = await self._call(self._foreign_commits, seen)
            except StoreError:
                continue  # the loops that need the database report its failures
            if changed:
                self.hints.publish(h.ENQUEUED, [h.ANY])
                self.hints.publish(h.CHANGED, [h.ANY])
                self.hints.publish(h.CANCEL, [str(i) for i in cancels])
                self.hints.publish(h.CONTROL, [str(i) for i in pauses])

    def _foreign_commits(self, seen: int | None) -> tuple[int, bool, list[int], list[int]]:
        """(data version, whether it moved, running jobs with a cancel request, those
        with only a pause request)."""
        conn = self._db()
        version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        if version == seen:
            return version, False, [], []
        rows = conn.execute(
            "SELECT id, cancel_requested_at IS NOT NULL FROM tether_jobs "
            "WHERE state = 'running' AND "
            "(cancel_requested_at IS NOT NULL OR pause_requested_at IS NOT NULL)"
        ).fetchall()
        cancels = [r[0] for r in rows if r[1]]
        pauses = [r[0] for r in rows if not r[1]]
        return version, seen is not None, cancels, pauses

    # -- API: tokens, audit log, live feed -------------------------------------------

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
        where = ["e.id > ?"]
        params: list[Any] = [after_id]
        for column, value in (("e.job_id", job_id), ("j.queue", queue), ("j.owner", owner)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if states is not None:
            where.append(f"e.to_state IN ({_marks(len(states))})")
            params.extend(states)
        sql = (
            "SELECT e.*, j.queue AS job_queue, j.task AS job_task, j.owner AS job_owner "
            "FROM tether_job_events e LEFT JOIN tether_jobs j ON j.id = e.job_id "
            f"WHERE {' AND '.join(where)} ORDER BY e.id LIMIT ?"
        )
        params.append(limit)

        def run() -> list[FeedEvent]:
            return [self._api.feed(r) for r in self._db().execute(sql, params)]

        return await self._call(run)

    async def last_event_id(self) -> int:
        def run() -> int:
            row = self._db().execute("SELECT COALESCE(MAX(id), 0) FROM tether_job_events")
            return int(row.fetchone()[0])

        return await self._call(run)

    async def list_owned_cancellations(
        self, owner: str, limit: int, offset: int
    ) -> list[CancellationRow]:
        def run() -> list[CancellationRow]:
            rows = self._db().execute(
                "SELECT c.* FROM tether_cancellations c JOIN tether_jobs j ON j.id = c.job_id "
                "WHERE j.owner = ? ORDER BY c.initiated_at DESC, c.id LIMIT ? OFFSET ?",
                (owner, limit, offset),
            )
            return [self._rows.cancellation(r) for r in rows]

        return await self._call(run)

    # -- maintenance: the leader's lease and retention ---------------------------------

    async def db_time(self) -> datetime:
        """This process's clock as SQLite reads it (every process on the file has its
        own; leases and schedules on SQLite are as good as the host clocks agree)."""
        row = await self._call(lambda: self._db().execute(f"SELECT {NOW}").fetchone())
        now = epoch_to_dt(row[0])
        assert now is not None
        return now

    def _leader(self, conn: sqlite3.Connection, name: str) -> LeaderInfo | None:
        row = conn.execute(
            f"SELECT name, holder, since, expires_at, expires_at >= {NOW} AS active "
            "FROM tether_leaders WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None:
            return None
        since, expires = epoch_to_dt(row["since"]), epoch_to_dt(row["expires_at"])
        assert since is not None and expires is not None
        return LeaderInfo(row["name"], row["holder"], since, expires, bool(row["active"]))

    async def lead(self, name: str, holder: str, ttl: float) -> LeaderInfo:
        def run(conn: sqlite3.Connection) -> LeaderInfo:
            # Take the lease if it is free or ran out; renew it if it is ours.
            conn.execute(
                "INSERT INTO tether_leaders (name, holder, since, expires_at) "
                f"VALUES (?, ?, {NOW}, {NOW} + ?) ON CONFLICT (name) DO UPDATE SET "
                "since = CASE WHEN holder = excluded.holder THEN since ELSE excluded.since END, "
                "holder = excluded.holder, expires_at = excluded.expires_at "
                "WHERE holder = excluded.holder OR expires_at < excluded.since",
                (name, holder, ttl),
            )
            info = self._leader(conn, name)
            assert info is not None
            return info

        return await self._write_async(run)

    async def resign(self, name: str, holder: str) -> None:
        await self._write_async(
            lambda conn: conn.execute(
                "DELETE FROM tether_leaders WHERE name = ? AND holder = ?", (name, holder)
            )
        )

    async def get_leader(self, name: str) -> LeaderInfo | None:
        return await self._call(lambda: self._leader(self._db(), name))

    async def prune_jobs(
        self,
        state: str,
        older_than: float,
        limit: int,
        after: tuple[object, int] | None,
        dry_run: bool,
    ) -> PruneBatch:
        def run(conn: sqlite3.Connection) -> PruneBatch:
            params: list[Any] = [state, older_than]
            since = ""
            if after is not None:
                since = "AND (finished_at, id) > (?, ?) "
                params += [after[0], after[1]]
            rows = conn.execute(
                "SELECT id, finished_at, parent_id IS NOT NULL OR has_children "
                "OR has_dependents OR EXISTS (SELECT 1 FROM tether_dependencies d "
                "WHERE d.job_id = tether_jobs.id) AS linked FROM tether_jobs "
                f"WHERE state = ? AND finished_at < {NOW} - ? {since}"
                # A failed job that holds its concurrency key stays until a person acts.
                "AND NOT (state = 'failed' AND limits IS NOT NULL AND EXISTS ("
                "SELECT 1 FROM json_each(tether_jobs.limits) e JOIN tether_limits l "
                "ON l.name = e.value WHERE l.kind = 'key' AND l.block_on_hold)) "
                "ORDER BY state, finished_at, id LIMIT ?",
                (*params, limit),
            ).fetchall()
            if not rows:
                return PruneBatch({}, 0)
            ids = [r["id"] for r in rows]
            linked = [r["id"] for r in rows if r["linked"]]
            kept = set(_in_live_workflow(conn, linked)) if linked else set()
            doomed = json.dumps([i for i in ids if i not in kept])
            counts = _delete_jobs(conn, doomed, dry_run)
            last = rows[-1]
            return PruneBatch(counts, len(rows), len(kept), (last["finished_at"], last["id"]))

        if dry_run:
            return await self._call(lambda: run(self._db()))
        return await self._write_async(run)

    async def prune_rows(self, kind: str, older_than: float, limit: int, dry_run: bool) -> int:
        if kind == "audit":
            pick = f"SELECT id FROM tether_audit WHERE at < {NOW} - ? ORDER BY at"
            table = "tether_audit"
        elif kind == "workers":
            pick = (
                "SELECT id FROM tether_workers w WHERE state IN ('stopped', 'dead') "
                f"AND heartbeat_at < {NOW} - ? AND NOT EXISTS (SELECT 1 FROM tether_jobs j "
                "WHERE j.state = 'running' AND j.worker_id = w.id) ORDER BY heartbeat_at"
            )
            table = "tether_workers"
        else:
            raise ValueError(f"unknown kind of rows to prune: {kind!r}")
        if dry_run:
            row = await self._call(
                lambda: (
                    self._db().execute(f"SELECT COUNT(*) FROM ({pick})", (older_than,)).fetchone()
                )
            )
            return int(row[0])
        return await self._write_async(
            lambda conn: (
                conn.execute(
                    f"DELETE FROM {table} WHERE id IN ({pick} LIMIT ?)", (older_than, limit)
                ).rowcount
            )
        )

    # -- periodic schedules --------------------------------------------------------------

    def _schedule(self, row: sqlite3.Row) -> ScheduleRow:
        return ScheduleRow(
            name=row["name"],
            task=row["task"],
            cron=row["cron"],
            timezone=row["timezone"],
            paused=bool(row["paused"]),
            last_tick=epoch_to_dt(row["last_tick"]),
            next_tick=epoch_to_dt(row["next_tick"]),
            last_run_at=epoch_to_dt(row["last_run_at"]),
            last_job_id=row["last_job_id"],
        )

    async def sync_schedule(
        self, name: str, task: str, cron: str, timezone: str, start: datetime
    ) -> ScheduleRow:
        def run(conn: sqlite3.Connection) -> ScheduleRow:
            row = conn.execute(
                "INSERT INTO tether_schedules (name, task, cron, timezone, last_tick, "
                f"created_at) VALUES (?, ?, ?, ?, ?, {NOW}) ON CONFLICT (name) DO UPDATE SET "
                "task = excluded.task, cron = excluded.cron, timezone = excluded.timezone "
                "RETURNING *",
                (name, task, cron, timezone, start.timestamp()),
            ).fetchone()
            return self._schedule(row)

        return await self._write_async(run)

    async def advance_schedule(
        self, name: str, tick: datetime, next_tick: datetime | None, job_id: int | None
    ) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(
                    "UPDATE tether_schedules SET last_tick = ?, next_tick = ?, "
                    "last_job_id = COALESCE(?, last_job_id), "
                    f"last_run_at = CASE WHEN ? IS NULL THEN last_run_at ELSE {NOW} END "
                    "WHERE name = ? AND (last_tick IS NULL OR last_tick < ?)",
                    (
                        tick.timestamp(),
                        next_tick.timestamp() if next_tick else None,
                        job_id,
                        job_id,
                        name,
                        tick.timestamp(),
                    ),
                ).rowcount
                > 0
            )

        return await self._write_async(run)

    async def list_schedules(self) -> list[ScheduleRow]:
        def run() -> list[ScheduleRow]:
            rows = self._db().execute("SELECT * FROM tether_schedules ORDER BY name")
            return [self._schedule(r) for r in rows]

        return await self._call(run)

    async def set_schedule_paused(self, name: str, paused: bool) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(
                    "UPDATE tether_schedules SET paused = ? WHERE name = ?", (int(paused), name)
                ).rowcount
                > 0
            )

        return await self._write_async(run)


class MemoryDatabase:
    """An in-memory database (for tests): one connection and one thread, which every
    store of this path shares. It lives as long as this object (its App keeps it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="tether-sqlite-memory")
        self.conn = sqlite3.connect(path, uri=True, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        _MEMORY[path] = self
        weakref.finalize(self, _release_memory, self.executor, self.conn)


def _release_memory(executor: ThreadPoolExecutor, conn: sqlite3.Connection) -> None:
    executor.shutdown(wait=True)  # idle: no store of the database is left to use it
    conn.close()


_MEMORY: weakref.WeakValueDictionary[str, MemoryDatabase] = weakref.WeakValueDictionary()


class CallerSqliteStore(SqliteStore):
    """A store whose writes join the caller's open transaction on the same file.

    It runs the ordinary store code on the caller's ``sqlite3.Connection``, in the
    caller's thread, inside a SAVEPOINT: the rows commit or roll back with the
    caller's own writes, and a failure leaves the caller's transaction as it was.
    Nothing is announced in-process; a worker's ``data_version`` watch sees the commit.
    """

    def __init__(self, url: str, path: str, conn: sqlite3.Connection) -> None:
        super().__init__(url, path)
        self._caller = conn
        self._check_same_file()

    def _check_same_file(self) -> None:
        row = self._caller.execute("PRAGMA database_list").fetchone()
        theirs = row[2] if row is not None else ""
        mine = self.path.split("?", 1)[0].removeprefix("file:")
        if theirs and os.path.exists(mine) and not os.path.samefile(theirs, mine):
            raise InvalidJobError(
                f"the connection is to {theirs}, not to this app's database {mine}"
            )

    async def open(self) -> None:
        pass  # the caller owns the connection

    async def close(self) -> None:
        pass

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Job]:
        # One savepoint in the caller's transaction, however many jobs: the caller holds
        # the write lock throughout, so chunks would only make it longer.
        return await self._write_async(functools.partial(self._insert_jobs, jobs, [], None))

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        conn = self._caller
        saved = conn.row_factory
        conn.row_factory = sqlite3.Row
        try:
            return fn(*args)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite ({self.path}): {exc}") from exc
        finally:
            conn.row_factory = saved

    def _db(self) -> sqlite3.Connection:
        return self._caller

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._caller
        if not conn.in_transaction:
            if conn.isolation_level is None:
                raise InvalidJobError(
                    "the sqlite3 connection is in autocommit mode outside a transaction; "
                    "run BEGIN first, so the job commits with your writes"
                )
            # The driver would begin at our first INSERT anyway; take the write lock now
            # so the reads before it see what the insert will.
            conn.execute("BEGIN IMMEDIATE")
        conn.execute("SAVEPOINT tether_enqueue")
        try:
            out = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK TO tether_enqueue")
            conn.execute("RELEASE tether_enqueue")
            raise
        conn.execute("RELEASE tether_enqueue")
        return out


async def _take(tx: Tx, candidates_sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """SQLite's claim under the write lock, which serializes claimers: read the
    candidates (``candidates_sql``) and the limits, choose
    (:func:`~tether.store.admission.admit`), write."""
    q = sqlite_sql.leases
    rows = await tx.tuples(candidates_sql, params)
    candidates = [(r[0], json.loads(r[1]) if r[1] else (), r[2], r[3]) for r in rows]
    tokens: dict[str, float] = {r[0]: r[1] for r in await tx.tuples(q.RATE_BUCKETS)}
    wanted = {n for c in candidates for n in c[1]}
    room: dict[str, int] = {}
    if wanted:
        room = {r[0]: r[1] for r in await tx.tuples(q.LIMIT_ROOM, {"names": sorted(wanted)})}
    chosen, spent = admit(candidates, room, tokens, params["limit"])
    if not chosen:
        return []
    for bucket, n in spent.items():
        await tx.run(q.SPEND_TOKENS, {"tokens": tokens[bucket], "spent": n, "id": bucket})
    return await tx.tuples(q.CLAIM_TAKE, {**params, "ids": chosen})


def _rate_limit(bucket: str, per_second: float, burst: int, tokens: float) -> RateLimitInfo:
    scope, name = bucket.split(":", 1)
    return RateLimitInfo(scope, name, per_second, burst, tokens)


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements, buf = [], ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--") and not buf.strip():
            continue
        buf += line
        if sqlite3.complete_statement(buf):
            statements.append(buf.strip())
            buf = ""
    if buf.strip():
        statements.append(buf.strip())
    return statements


# The jobs a pruning batch deletes with their rows elsewhere, or counts in a dry run.
_PRUNE_TABLES = (
    ("events", "tether_job_events", "job_id IN {each}"),
    ("dependencies", "tether_dependencies", "job_id IN {each} OR depends_on IN {each}"),
    ("artifacts", "tether_artifacts", "job_id IN {each}"),
    ("cancellations", "tether_cancellations", "job_id IN {each}"),
    ("jobs", "tether_jobs", "id IN {each}"),
)


def _delete_jobs(conn: sqlite3.Connection, ids_json: str, dry_run: bool) -> dict[str, int]:
    counts = {}
    for kind, table, where in _PRUNE_TABLES:
        cond = where.format(each=EACH)
        args = (ids_json,) * cond.count("?")
        if dry_run:
            counts[kind] = int(
                conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {cond}", args).fetchone()[0]
            )
        else:
            counts[kind] = conn.execute(f"DELETE FROM {table} WHERE {cond}", args).rowcount
    return counts


# Every job connected to the seeds through parents, children and dependencies, either way.
_REACH = """
    UNION SELECT j.parent_id FROM tether_jobs j JOIN {cte} r ON j.id = r.id
        WHERE j.parent_id IS NOT NULL
    UNION SELECT c.id FROM tether_jobs c JOIN {cte} r ON c.parent_id = r.id
    UNION SELECT d.depends_on FROM tether_dependencies d JOIN {cte} r ON d.job_id = r.id
    UNION SELECT d.job_id FROM tether_dependencies d JOIN {cte} r ON d.depends_on = r.id
"""


def _in_live_workflow(conn: sqlite3.Connection, ids: list[int]) -> list[int]:
    """Those of ``ids`` whose workflow (the jobs connected to them) has an active member.

    Two walks: first everything connected to ``ids``, then, from the active jobs found
    there, everything connected to those: the ids reached last are kept. Each walk costs
    the size of the workflows touched, not of the table.
    """
    seeds = json.dumps(ids)
    rows = conn.execute(
        f"WITH RECURSIVE reach(id) AS (SELECT value FROM json_each(?) {_REACH.format(cte='reach')}"
        f"), live(id) AS (SELECT j.id FROM tether_jobs j WHERE j.id IN (SELECT id FROM reach) "
        f"AND j.state IN ({LIVE_SQL}) {_REACH.format(cte='live')}) "
        "SELECT value FROM json_each(?) WHERE value IN (SELECT id FROM live)",
        (seeds, seeds),
    )
    return [int(r[0]) for r in rows]
