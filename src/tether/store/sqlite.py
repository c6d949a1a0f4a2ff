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
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from tether import hints as h
from tether.errors import InvalidJobError, StoreError
from tether.hints import Hints
from tether.job import (
    Job,
    NewJob,
    Outcome,
)
from tether.store.admission import admit
from tether.store.api_rows import ApiRowReader
from tether.store.common import SqlStore
from tether.store.driver import Body, Tx, run_inline
from tether.store.rows import RowReader
from tether.store.sql import sqlite as sqlite_sql
from tether.store.sql.sqlite.fragments import NOW
from tether.store.sqlite_tx import SqliteTx
from tether.store.sqlite_workflow import propagate

T = TypeVar("T")

EACH = "(SELECT value FROM json_each(?))"
# How often a listening store checks for other processes' commits.
WATCH_INTERVAL = 0.1
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
# The touched_at of a batch whose discard has begun: stale under any clock, and final.
# Its producer's next chunk and its close both refuse, so a producer that wakes up
# between two of the discard's transactions gets an error, never a half-deleted bulk.
DISCARDING = 0.0
# A producer's chunk and its close (under the write lock, with their own writes): the
# batch is still open and no discard has begun.
TOUCH_BATCH = (
    f"UPDATE tether_open_batches SET touched_at = {NOW} "
    f"WHERE id = :batch AND touched_at <> {DISCARDING}"
)
CLOSE_BATCH = f"DELETE FROM tether_open_batches WHERE id = ? AND touched_at <> {DISCARDING}"
# The discard's look, under the write lock: (being discarded already, abandoned now).
BATCH_STATE = (
    f"SELECT touched_at = {DISCARDING}, touched_at < {NOW} - ? "
    "FROM tether_open_batches WHERE id = ?"
)
ABANDONED = "bulk enqueue abandoned: it stalled too long between chunks and was discarded"


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
        # Awaited before every hop to the store thread (one read, or one write
        # transaction): a test's scheduler parks the call there to choose which of two
        # operations' transactions runs next. None in production.
        self.step: Callable[[], Awaitable[None]] | None = None

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
        if self.step is not None:
            await self.step()
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

    # -- producers and readers -----------------------------------------------------------

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Job]:
        if len(jobs) <= BULK_CHUNK:
            return await super().enqueue(jobs)
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
                out += await self._transact(
                    functools.partial(self._chunk, jobs[i : i + BULK_CHUNK], ids, batch)
                )
            closed = await self._write_async(
                lambda conn: conn.execute(CLOSE_BATCH, (batch,)).rowcount
            )
            if not closed:
                raise StoreError(ABANDONED)
        except BaseException:
            # Shielded: a cancelled enqueue still removes what it wrote.
            await asyncio.shield(self._discard_batch(batch, abandoned_only=False))
            raise
        return out

    def _abandoned_batches(self) -> list[str]:
        """Candidates only: each is judged again under the write lock before a job goes."""
        rows = self._db().execute(
            f"SELECT id FROM tether_open_batches WHERE touched_at < {NOW} - ?",
            (BULK_ABANDONED_AFTER,),
        )
        return [r[0] for r in rows]

    async def _discard_batch(self, batch: str, *, abandoned_only: bool) -> None:
        """Delete an open batch's jobs, in short transactions, then the batch.
        ``abandoned_only``: the rescue's discard, which leaves a batch whose producer
        committed a chunk since it looked."""
        discard = functools.partial(self._discard_chunk, batch, abandoned_only)
        while await self._write_async(discard):
            pass

    def _discard_chunk(self, batch: str, abandoned_only: bool, conn: sqlite3.Connection) -> bool:
        """Under the write lock: mark the batch as being discarded (its producer can no
        longer add to it or close it), then delete up to a chunk of its jobs; ``False``
        once none is left (the batch is gone then), or when there is nothing to discard:
        a closed batch (its jobs are real), or, with ``abandoned_only``, one whose
        producer is live again and whose discard has not begun."""
        row = conn.execute(BATCH_STATE, (BULK_ABANDONED_AFTER, batch)).fetchone()
        if row is None:
            return False
        discarding, abandoned = row
        if not discarding:
            if abandoned_only and not abandoned:
                return False
            conn.execute(
                "UPDATE tether_open_batches SET touched_at = ? WHERE id = ?", (DISCARDING, batch)
            )
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

    async def _chunk(self, jobs: Sequence[NewJob], ids: list[int], batch: str, tx: Tx) -> list[Job]:
        """Insert one chunk of a bulk (``ids``: the ids of its earlier chunks, extended)."""
        # In this chunk's transaction: a batch whose discard has begun stays discarded.
        if not await tx.run(TOUCH_BATCH, {"batch": batch}):
            raise StoreError(ABANDONED)
        out, _ = await self._insert_jobs(tx, jobs, ids, batch)
        return out

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

    # -- maintenance and schedules (common/maintenance.py, schedules.py): SQLite's hooks --

    async def _before_rescue(self) -> None:
        # A bulk enqueue whose process died half-way: its jobs were never claimable;
        # delete them, as its producer would have on failure.
        for batch in await self._call(self._abandoned_batches):
            await self._discard_batch(batch, abandoned_only=True)

    async def _prune_dry_run(self, body: Body[T]) -> T:
        # A read: a dry run takes no write lock (PostgreSQL's runs in a transaction).
        return await self._query(body)

    def _time_param(self, value: datetime | None) -> Any:
        # Unix seconds, as SQLite keeps every time.
        return None if value is None else value.timestamp()

    # -- workflows -----------------------------------------------------------------------

    async def _after_transitions(self, tx: Tx, changed: list[int]) -> None:
        await propagate(tx, changed)

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
        # INDEXED BY, as in the rescue: statistics of a mostly finished table would
        # have the planner scan it all at every foreign commit.
        rows = conn.execute(
            "SELECT id, cancel_requested_at IS NOT NULL FROM tether_jobs "
            "INDEXED BY tether_jobs_running WHERE state = 'running' AND "
            "(cancel_requested_at IS NOT NULL OR pause_requested_at IS NOT NULL)"
        ).fetchall()
        cancels = [r[0] for r in rows if r[1]]
        pauses = [r[0] for r in rows if not r[1]]
        return version, seen is not None, cancels, pauses


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
        return await SqlStore.enqueue(self, jobs)

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
        _refuse_autocommit(conn)
        if not conn.in_transaction:
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


def _refuse_autocommit(conn: sqlite3.Connection) -> None:
    """Refuse, before anything is written, a connection whose ``commit()`` would not
    commit what tether writes on it: the job would hold the write lock until the
    connection closes, and then be gone."""
    # PEP 249's attribute (Python 3.12+): True makes commit() a no-op, even inside a
    # BEGIN the caller ran; False keeps a transaction open that commit() commits.
    # LEGACY_TRANSACTION_CONTROL (and older Pythons, without it) leave it to
    # isolation_level, where None means autocommit.
    autocommit = getattr(conn, "autocommit", getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1))
    if autocommit is True:
        raise InvalidJobError(
            "the sqlite3 connection was opened with autocommit=True, where commit() does "
            "nothing; open it with autocommit=False (or the default), so the job commits "
            "with your writes"
        )
    if autocommit is False or conn.in_transaction:
        return
    if conn.isolation_level is None:
        raise InvalidJobError(
            "the sqlite3 connection is in autocommit mode outside a transaction; "
            "run BEGIN first, so the job commits with your writes"
        )


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
