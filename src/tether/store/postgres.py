"""The PostgreSQL store: psycopg 3 with a connection pool, SKIP LOCKED and LISTEN/NOTIFY.

Batch operations send arrays and run as one statement. NOTIFY carries ids and queue
names only, once per statement. One extra connection per store listens for
notifications.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import struct
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any, LiteralString
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from tether import hints as h
from tether.config import DEFAULT_POOL_SIZE, StoreConfig
from tether.errors import ConfigError, InvalidJobError, JobNotFoundError, StoreError
from tether.hints import Hints
from tether.job import (
    CancellationRow,
    FeedEvent,
    Job,
    JobEvent,
    JobFilter,
    LimitInfo,
    NewJob,
    QueueInfo,
    RateLimitInfo,
    WorkerInfo,
)
from tether.ops import LeaderInfo, PruneBatch, ScheduleRow
from tether.procinfo import PidSpace, pid_space
from tether.states import ACTIVE, TERMINAL
from tether.store.api_rows import ApiRowReader
from tether.store.base import ProcessGone, check_dependencies, load_migrations
from tether.store.common import SqlStore
from tether.store.driver import Body, T
from tether.store.postgres_tx import CHANNELS, SERVER_CHANNELS, PostgresTx, chunks
from tether.store.rows import (
    CANCEL_STATE,
    CANCELLABLE_SQL,
    JOB_COLUMNS,
    RESCUE_STATE,
    RowReader,
    worker_process,
)
from tether.store.sql import postgres as pg_sql

log = logging.getLogger("tether.store")
Conn = psycopg.AsyncConnection[dict[str, Any]]

# Transitions notify ``tether_changed`` only while some process says it listens there
# (a row in ``tether_listeners``, renewed every LISTENER_RENEW seconds, valid for
# LISTENER_TTL): a notifying commit takes a server-wide lock, which a fleet of workers
# completing jobs that nobody waits for should not queue on.
CHANGED_CHANNEL = "tether_changed"
LISTENER_RENEW = 10.0
LISTENER_TTL = 30.0
# How often the LISTEN connection follows its store's subscriptions (a new channel is
# listened to within this), and how often it checks the connection with a round trip.
LISTEN_SYNC = 0.2
LISTEN_PING = 1.0
MIGRATE_LOCK = 0x7E7E_0002
KEY_LOCK_SPACE = 0x7E7E  # first key of the per-idempotency-key advisory locks
# Errors after which a connection is not reused, nor any other connection the pool
# opened before: the server changed under them. 25006: read-only (a failover to a
# standby, or ``default_transaction_read_only``, which a session keeps from its start
# to its end); 57P01-57P03: shut down or not accepting connections; class 08: the
# connection broke.
DISCARD_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})
# TCP settings of every connection: a peer that vanished without a FIN (a dead host, a
# dropped route) is noticed by the kernel within seconds rather than hours.
TCP_KWARGS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # ms of unacknowledged data before the kernel gives up
}
# The LISTEN connection's retry delay doubles up to LISTEN_MAX_DELAY and starts short
# again only once a connection has stayed up for LISTEN_HEALTHY seconds.
LISTEN_FIRST_DELAY = 0.1
LISTEN_MAX_DELAY = 10.0
LISTEN_HEALTHY = 30.0
LOG_EVERY = 30.0  # seconds between two log lines about the same outage
TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL))
ACTIVE_SQL = ", ".join(f"'{s.value}'" for s in sorted(ACTIVE))

# Every enqueue, one statement for the whole batch. Linked jobs (dependencies, a parent)
# arrive with ids drawn from the sequence already; the others take theirs here, in row
# order.
Q_ENQUEUE: LiteralString = f"""
INSERT INTO tether_jobs (id, task, args, queue, priority, key, state, max_attempts, timeout,
                         run_at, owner, idempotency_key, actor, budget, limits, parent_id,
                         has_dependents, idempotency_expires_at)
SELECT COALESCE(i, nextval('tether_jobs_id_seq')), t, a::jsonb, q, p, k, st, m, tmo,
       COALESCE(ra, now() + make_interval(secs => d)), o, ik, 'enqueue', b,
       CASE WHEN l IS NULL THEN NULL ELSE ARRAY(SELECT jsonb_array_elements_text(l::jsonb))
       END, par, hd, now() + make_interval(secs => uf)
FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::int[], %s::text[],
            %s::text[], %s::int[], %s::float8[], %s::float8[], %s::text[], %s::text[],
            %s::bigint[], %s::text[], %s::bigint[], %s::boolean[], %s::timestamptz[],
            %s::float8[])
     AS x(i, t, a, q, p, k, st, m, tmo, d, o, ik, b, l, par, hd, ra, uf)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING {JOB_COLUMNS}
"""

# A key whose uniqueness window has passed is let go by its old job, so that this
# enqueue creates a new one (run under the keys' locks, before the insert).
Q_RELEASE_KEYS: LiteralString = """
UPDATE tether_jobs SET idempotency_key = NULL
WHERE idempotency_key = ANY(%s) AND idempotency_expires_at <= now()
"""

# Concurrent batches sharing idempotency keys in different orders would deadlock on the
# unique index; taking a lock per key in one global order first makes them queue instead.
Q_LOCK_KEYS: LiteralString = """
SELECT pg_advisory_xact_lock(%s, h) FROM (
    SELECT DISTINCT hashtext(k) AS h FROM unnest(%s::text[]) AS k
) AS keys ORDER BY h
"""

# A rate limit's bucket as of now: what it held, refilled since, never above the burst.
RATE_TOKENS: LiteralString = (
    "least(burst, tokens + greatest(0, extract(epoch FROM now() - refilled_at)) * per_second)"
)

Q_CANCEL: LiteralString = f"""
UPDATE tether_jobs SET
    state = {CANCEL_STATE},
    finished_at = CASE WHEN state = 'running' THEN finished_at ELSE now() END,
    cancel_requested_at = COALESCE(cancel_requested_at, now()),
    cancel_reason = COALESCE(cancel_reason, %(reason)s),
    cancel_force = cancel_force OR %(force)s, actor = %(actor)s, reason = %(reason)s,
    cancel_cascade = %(cascade)s
WHERE id = %(id)s AND state IN ({CANCELLABLE_SQL})
RETURNING {JOB_COLUMNS}
"""

Q_PAUSE: LiteralString = f"""
UPDATE tether_jobs SET
    state = CASE WHEN state = 'running' THEN state ELSE 'paused' END,
    pause_requested_at = COALESCE(pause_requested_at, now()),
    pause_reason = COALESCE(%(reason)s, pause_reason), actor = %(actor)s,
    reason = COALESCE(%(reason)s, 'paused')
WHERE id = %(id)s AND state IN ('queued', 'retrying', 'running')
RETURNING {JOB_COLUMNS}
"""

Q_RESUME: LiteralString = f"""
UPDATE tether_jobs SET
    state = CASE WHEN state = 'paused' THEN 'queued' ELSE state END,
    run_at = CASE WHEN state = 'paused' THEN now() ELSE run_at END,
    pause_requested_at = NULL, pause_reason = NULL, budget = COALESCE(%(budget)s, budget),
    actor = %(actor)s, reason = 'resumed'
WHERE id = %(id)s AND (state = 'paused' OR (state = 'running' AND pause_requested_at IS NOT NULL))
RETURNING {JOB_COLUMNS}
"""

Q_RETRY: LiteralString = f"""
UPDATE tether_jobs SET state = 'queued', attempt = 0, run_at = now(), finished_at = NULL,
    cancel_requested_at = NULL, cancel_reason = NULL, cancel_force = false,
    pause_requested_at = NULL, pause_reason = NULL,
    actor = %(actor)s, reason = 'retried by a person'
WHERE id = %(id)s AND state = 'failed'
RETURNING {JOB_COLUMNS}
"""

Q_RESCUE: LiteralString = f"""
-- Only workers that beat within the last hour: the rows of workers long dead (kept
-- until the pruner reaps them) would otherwise be read at every pass. A job of a worker
-- silent for longer has an expired lease anyway, unless its leases outlast an hour,
-- and then the lease's end hands it back.
WITH dead AS (SELECT id FROM tether_workers WHERE state = 'dead'
              AND heartbeat_at > now() - interval '1 hour')
UPDATE tether_jobs SET state = {RESCUE_STATE},
    lease_token = lease_token + 1, lease_expires_at = NULL,
    -- Recovered work that has a checkpoint goes first: back to its place in line. Other
    -- recovered work goes to the back of the line, behind every job already waiting
    -- (even one stamped with the same instant), so the order never rests on timing.
    run_at = CASE WHEN checkpoint IS NOT NULL THEN LEAST(run_at, created_at)
             ELSE GREATEST(now(), (SELECT max(w.run_at) FROM tether_jobs w
                                   WHERE w.state IN ('queued', 'retrying')
                                   AND w.run_at <= now()) + interval '1 microsecond') END,
    finished_at = CASE WHEN {RESCUE_STATE} IN ({TERMINAL_SQL}) THEN now() ELSE NULL END,
    error = 'worker ' || COALESCE(worker_id, '?') || ' lost its lease (attempt '
            || attempt || '/' || max_attempts || ')',
    actor = 'rescuer',
    -- Smart phase recovery: a later phase without children (the crash came between
    -- the phase change and the spawns) starts again from the first phase.
    phase = CASE WHEN phase IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM tether_jobs c WHERE c.parent_id = tether_jobs.id) THEN NULL
            ELSE phase END,
    reason = CASE WHEN cancel_requested_at IS NOT NULL THEN 'rescued with a pending cancel'
             WHEN pause_requested_at IS NOT NULL THEN 'rescued with a pending pause'
             WHEN worker_id IN (SELECT id FROM dead) THEN 'worker dead'
             ELSE 'lease expired' END
             || CASE WHEN phase IS NULL THEN ''
                WHEN EXISTS (SELECT 1 FROM tether_jobs c WHERE c.parent_id = tether_jobs.id)
                THEN '; staying in phase ' || phase || ' ('
                     || (SELECT count(*) FROM tether_jobs c WHERE c.parent_id = tether_jobs.id)
                     || ' children found)'
                ELSE '; reset to the ingest phase (no children found)' END
-- The candidates: running jobs whose lease expired (through the partial index of running
-- jobs; one pass a second for the fleet, on the maintenance leader), and the running
-- jobs of recently dead workers, looked up by worker. Their rows are then locked in id
-- order and the conditions checked again.
WHERE id IN (SELECT id FROM tether_jobs
             WHERE id = ANY(ARRAY(
                 SELECT id FROM tether_jobs WHERE state = 'running' AND lease_expires_at < now()
                 UNION ALL
                 -- OFFSET 0 keeps this a lookup per dead worker (of the running jobs'
                 -- index by worker), never a join that reads every running job.
                 SELECT j.id FROM dead, LATERAL (
                     SELECT id FROM tether_jobs
                     WHERE state = 'running' AND worker_id = dead.id OFFSET 0) AS j))
             AND state = 'running'
             AND (lease_expires_at < now() OR worker_id IN (SELECT id FROM dead))
             ORDER BY id FOR UPDATE)
RETURNING {JOB_COLUMNS}
"""

Q_SPAWN: LiteralString = f"""
INSERT INTO tether_jobs (task, args, queue, priority, key, state, max_attempts, timeout, run_at,
                         owner, idempotency_key, actor, budget, limits, parent_id)
SELECT %(task)s, %(args)s::jsonb, %(queue)s, %(priority)s, %(key)s, 'queued',
       %(max_attempts)s, %(timeout)s, now() + make_interval(secs => %(delay)s), p.owner,
       %(idem)s, 'spawn', %(budget)s, %(limits)s::text[], p.id
FROM tether_jobs p
-- Fenced by the parent's lease: a cancelled, deleted or rescued parent cannot spawn.
WHERE p.id = %(parent)s AND p.lease_token = %(token)s AND p.state = 'running'
  AND p.cancel_requested_at IS NULL
RETURNING {JOB_COLUMNS}
"""

Q_CANCEL_CHILDREN: LiteralString = f"""
UPDATE tether_jobs SET state = 'cancelled',
    cancel_requested_at = COALESCE(cancel_requested_at, now()),
    cancel_reason = COALESCE(cancel_reason, 'parent job deleted'),
    lease_token = lease_token + (state = 'running')::int, lease_expires_at = NULL,
    finished_at = now(), actor = %(actor)s, reason = 'parent job deleted'
WHERE parent_id = %(parent)s AND state IN ('queued', 'blocked', 'running', 'retrying', 'paused')
RETURNING {JOB_COLUMNS}
"""

Q_DEAD_SESSIONS: LiteralString = """
UPDATE tether_workers SET state = 'dead'
WHERE state IN ('active', 'draining') AND backend_pid IS NOT NULL
  AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity)
  AND heartbeat_at < now() - make_interval(secs => %s)
RETURNING id
"""


def _columns(rows: Sequence[tuple[int | None, NewJob, str, bool]]) -> list[list[Any]]:
    """:data:`Q_ENQUEUE`'s arrays from (id or None, job, first state, has dependents)."""
    cols: list[list[Any]] = [[] for _ in range(18)]
    for new_id, j, state, has_dependents in rows:
        for col, value in zip(
            cols,
            (
                new_id,
                j.task,
                j.args_json,
                j.queue,
                j.priority,
                j.key,
                state,
                j.max_attempts,
                # float8[] columns: psycopg refuses a list mixing int and float.
                None if j.timeout is None else float(j.timeout),
                float(j.delay),
                j.owner,
                j.idempotency_key,
                j.budget,
                json.dumps(j.limits) if j.limits else None,
                j.parent_id,
                has_dependents,
                j.run_at,
                None if j.unique_for is None else float(j.unique_for),
            ),
            strict=True,
        ):
            col.append(value)
    return cols


URL_SETTINGS = ("pool_size", "statement_timeout", "answer_timeout", "pgbouncer", "listen_url")
TRUE_WORDS = ("1", "true", "yes", "on")


def split_url(url: str, config: StoreConfig) -> tuple[str, StoreConfig]:
    """The URL for the driver, and the config with the URL's own query parameters.

    ``pool_size``, ``statement_timeout``, ``answer_timeout``, ``pgbouncer`` and
    ``listen_url`` are tether's; the driver would refuse them, so they are taken out of
    the URL.
    """
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in params if k in URL_SETTINGS}
    if not ours:
        return url, config
    rest = urlencode([(k, v) for k, v in params if k not in ours])
    values: dict[str, Any] = {}
    try:
        for k, v in ours.items():
            if k == "pool_size":
                values[k] = int(v)
            elif k == "pgbouncer":
                if v.lower() not in (*TRUE_WORDS, "0", "false", "no", "off"):
                    raise ValueError(f"pgbouncer={v!r} (use true or false)")
                values[k] = v.lower() in TRUE_WORDS
            elif k == "listen_url":
                values[k] = v or None
            else:
                values[k] = float(v)
    except ValueError as exc:
        raise ConfigError(f"malformed PostgreSQL URL parameter: {exc}") from None
    return urlunsplit(parts._replace(query=rest)), dataclasses.replace(config, **values)


def _needs_discard(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says the connection, and its pool, cannot be trusted any more."""
    state = exc.sqlstate
    if state is None:
        # No answer from the server at all: the connection broke.
        return isinstance(exc, psycopg.OperationalError)
    return state in DISCARD_SQLSTATES or state.startswith("08")


def _sever(conn: psycopg.AsyncConnection[Any]) -> None:
    """Shut a connection's socket down under the driver.

    A call blocked on it fails at once (the driver reads end of file), and the pool
    discards the broken connection. Cancelling the call instead would not do: the
    driver then asks the server to cancel the statement and waits for the answer,
    which a partitioned server never sends.
    """
    with contextlib.suppress(Exception):
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            # When the driver closes it, reset rather than deliver what is still unsent.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class _Deadline:
    """Watches one call on one connection; see :class:`~tether.config.StoreConfig`.

    After ``answer_timeout`` without the call ending, it asks the server (on a fresh
    connection, within ``connect_timeout``) whether the call's session is working. If
    it is, the watch starts again; if not, or if the server does not answer, the
    connection is severed and the call fails.
    """

    def __init__(self, store: PostgresStore, conn: psycopg.AsyncConnection[Any]) -> None:
        self.store = store
        self.conn = conn
        self.pid = conn.info.backend_pid
        self.abandoned = False
        self._loop = asyncio.get_running_loop()
        self._probe: asyncio.Task[None] | None = None
        self._timer = self._loop.call_later(store.settings.answer_timeout, self._expired)

    def _expired(self) -> None:
        self._probe = self._loop.create_task(self._check())
        self._probe.add_done_callback(_retrieve)

    async def _check(self) -> None:
        if await self.store._working(self.pid):
            self._timer = self._loop.call_later(self.store.settings.answer_timeout, self._expired)
            return
        self.abandoned = True
        _sever(self.conn)

    def disarm(self) -> None:
        self._timer.cancel()
        if self._probe is not None:
            self._probe.cancel()


class LogThrottle(logging.Filter):
    """Lets a logger's first warning through, then at most one per ``every`` seconds,
    saying how many were held back: an outage cannot flood the log."""

    def __init__(self, every: float) -> None:
        super().__init__()
        self.every = every
        self.last = -1e9
        self.held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        now = time.monotonic()
        if now - self.last < self.every:
            self.held += 1
            return False
        if self.held:
            record.msg = f"{record.msg} ({self.held} more held back in the last {self.every:.0f}s)"
            self.held = 0
        self.last = now
        return True


# psycopg's pool logs a warning per failed connection attempt (about one a second while
# the database is down): it follows the same rule as tether's own loops.
POOL_LOG_THROTTLE = LogThrottle(LOG_EVERY)
logging.getLogger("psycopg.pool").addFilter(POOL_LOG_THROTTLE)


class PostgresStore(SqlStore):
    """A :class:`~tether.store.base.Store` on PostgreSQL."""

    dialect = "postgresql"
    sql = pg_sql
    _api = ApiRowReader(RowReader(text_json=False, epoch_times=False), epoch_times=False)

    def __init__(self, url: str, config: StoreConfig | None = None) -> None:
        self.url = url
        self._dsn, self.settings = split_url(url, config or StoreConfig())
        cfg = self.settings
        # The LISTEN connection (and the liveness session it is) goes straight to the
        # server when a pooler stands in between; its URL may not carry our parameters.
        self._listen_dsn: str | None = split_url(cfg.listen_url, cfg)[0] if cfg.listen_url else None
        if not cfg.pgbouncer:
            self._listen_dsn = self._listen_dsn or self._dsn
        options = conninfo_to_dict(self._dsn).get("options") or ""
        # Server side, no statement runs longer than this; the client side is _Deadline.
        timeout_ms = max(1, round(cfg.statement_timeout * 1000))
        self._listen_kwargs: dict[str, Any] = {
            **TCP_KWARGS,
            "connect_timeout": max(2, round(cfg.connect_timeout)),
            "options": f"{options} -c statement_timeout={timeout_ms}".strip(),
        }
        self._connect_kwargs = dict(self._listen_kwargs)
        if cfg.pgbouncer:
            # A pooler in transaction mode hands each transaction any server connection:
            # a statement prepared on one is missing, or already exists, on the next.
            # It also refuses the ``options`` startup parameter, so the server-side
            # statement timeout is the pooler's or the role's to set (see the guide).
            self._connect_kwargs["prepare_threshold"] = None
            del self._connect_kwargs["options"]
        self.hints = Hints()
        self._pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self._dsn,
            min_size=1,
            max_size=cfg.pool_size or DEFAULT_POOL_SIZE,
            open=False,
            connection_class=psycopg.AsyncConnection[dict[str, Any]],
            kwargs={"autocommit": True, "row_factory": dict_row, **self._connect_kwargs},
            name="tether",
            # Fail fast while the database is down (the callers' loops back off), and
            # within the time a call may take to notice a partition.
            timeout=cfg.answer_timeout + cfg.connect_timeout,
            # The pool's reconnect delay doubles without a cap until it gives up (300 s
            # by default), so after a long outage it would idle for minutes once the
            # database is back. Giving up after 30 s lets the next request start afresh.
            reconnect_timeout=30.0,
            configure=self._track,
        )
        # Every connection the pool made, so that close() ends them all (see there).
        self._conns: weakref.WeakSet[Conn] = weakref.WeakSet()
        self._opened = False
        self._rows = RowReader(text_json=False, epoch_times=False)
        self._listener: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._backend_pid: int | None = None
        self._workers: set[str] = set()
        # Channels listened on (by the LISTEN connection), and those a worker of this
        # store needs from its registration on, subscribed or not yet.
        self._listening: set[str] = set()
        self._sticky: set[str] = set()
        self._followed = asyncio.Event()  # set each time the listened channels are synced
        self._listen_delay = LISTEN_FIRST_DELAY
        self._listen_failures = 0

    # -- plumbing ------------------------------------------------------------------------

    async def open(self) -> None:
        if not self._opened:
            # One direct connection first: its error names the real cause (bad password,
            # unknown database, refused), which the pool only logs.
            try:
                probe = await psycopg.AsyncConnection.connect(
                    self._dsn, **{**self._connect_kwargs, "connect_timeout": 10}
                )
                await probe.close()
                await self._pool.open(wait=True, timeout=10)
            except Exception as exc:
                raise StoreError(f"cannot connect to PostgreSQL: {exc}".strip()) from exc
            self._opened = True

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(BaseException):
                await self._listener
            self._listener = None
        if self._opened:
            self._opened = False
            try:
                await self._pool.close()
            except asyncio.CancelledError:
                # asyncio.run cancels every task before its loop closes, the pool's own
                # workers among them; the pool's close then stops at their
                # cancellation, before it closes its idle connections.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
            finally:
                for conn in list(self._conns):
                    if not conn.closed:
                        await conn.close()

    async def _track(self, conn: Conn) -> None:
        self._conns.add(conn)

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[dict[str, Any]]]:
        if not self._opened:
            await self.open()
        try:
            async with self._pool.connection() as conn, self._bounded(conn):
                yield conn
        except psycopg.Error as exc:
            raise StoreError(f"postgresql: {exc}") from exc

    async def _query(self, body: Body[T]) -> T:
        async with self._conn() as conn:
            return await body(PostgresTx(conn))

    async def _change(self, body: Body[T]) -> T:
        return await self._query(body)

    async def _transact(self, body: Body[T]) -> T:
        async with self._conn() as conn, conn.transaction():
            return await body(PostgresTx(conn))

    @contextlib.asynccontextmanager
    async def _bounded(self, conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
        """Run a call on ``conn`` under a :class:`_Deadline`; a connection that failed
        in a way that makes it (and its pool) untrustworthy is not reused."""
        deadline = _Deadline(self, conn)
        try:
            yield
        except psycopg.Error as exc:
            if _needs_discard(exc) or deadline.abandoned:
                await self._discard(conn)
            if deadline.abandoned:
                raise psycopg.OperationalError(
                    f"the database did not answer within {self.settings.answer_timeout:g}s "
                    "(connection abandoned)"
                ) from exc
            raise
        finally:
            deadline.disarm()

    async def _discard(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Close ``conn`` and replace every connection the pool opened before it, before
        the caller can try again."""
        with contextlib.suppress(Exception):
            conn.pgconn.finish()
        if self._opened:
            with contextlib.suppress(Exception):
                await self._pool.drain()

    async def _working(self, pid: int) -> bool:
        """Whether the server says session ``pid`` is running a statement or is inside
        a transaction (or refuses to say, busy); False when it does not answer within
        ``connect_timeout``."""

        async def ask() -> bool:
            conn = await psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, **self._connect_kwargs
            )
            try:
                if self.settings.pgbouncer:
                    # Behind a pooler ``pid`` names no session of ours: a pooler and
                    # server that answer are presumed to be working on the call.
                    await conn.execute("SELECT 1")
                    return True
                # Idle in a transaction counts too: between two statements of one call
                # the client may be busy building the next (a big bulk enqueue); a
                # connection truly cut off is caught by this probe failing, or by
                # tcp_user_timeout.
                cur = await conn.execute(
                    "SELECT state IN ('active', 'idle in transaction') FROM pg_stat_activity "
                    "WHERE pid = %s",
                    (pid,),
                )
                row = await cur.fetchone()
                return bool(row and row[0])
            finally:
                await conn.close()

        call = asyncio.ensure_future(ask())
        call.add_done_callback(_retrieve)
        # Not wait_for: it would wait for the cancelled call to unwind.
        done, _ = await asyncio.wait({call}, timeout=self.settings.connect_timeout)
        if not done:
            call.cancel()
            return False
        exc = call.exception()
        if isinstance(exc, psycopg.Error) and exc.sqlstate is not None:
            # The server answered, if only to refuse (too many connections, say): it is
            # reachable and busy, and the statement timeout bounds the call.
            return True
        return exc is None and call.result()

    async def _notify(
        self, conn: psycopg.AsyncConnection[Any], channel: str, ids: Sequence[str]
    ) -> None:
        for payload in chunks(ids):
            await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))

    # -- schema --------------------------------------------------------------------------

    async def schema_version(self) -> int:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT to_regclass('tether_migrations') AS t")
            row = await cur.fetchone()
            if row is None or row["t"] is None:
                return 0
            cur = await conn.execute("SELECT COALESCE(MAX(version), 0) AS v FROM tether_migrations")
            row = await cur.fetchone()
            return int(row["v"]) if row else 0

    async def applied_migrations(self) -> set[int]:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT to_regclass('tether_migrations') AS t")
            row = await cur.fetchone()
            if row is None or row["t"] is None:
                return set()
            cur = await conn.execute("SELECT version FROM tether_migrations")
            return {int(r["version"]) for r in await cur.fetchall()}

    async def migrate(self) -> list[int]:
        async with self._conn() as conn, conn.transaction():
            # Several workers may start at once; one migrates, the others wait and see.
            # A migration may take long (an index on a big table): no statement timeout.
            await conn.execute("SET LOCAL statement_timeout = 0")
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS tether_migrations (version INTEGER PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            cur = await conn.execute("SELECT version FROM tether_migrations")
            done = {r["version"] for r in await cur.fetchall()}
            applied = []
            for mig in load_migrations("postgres"):
                if mig.version in done:
                    continue
                await conn.execute(sql.SQL(mig.sql))  # type: ignore[arg-type,unused-ignore]
                await conn.execute(
                    "INSERT INTO tether_migrations (version, name) VALUES (%s, %s)",
                    (mig.version, mig.name),
                )
                applied.append(mig.version)
            return applied

    # -- producers and readers -----------------------------------------------------------

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Job]:
        if not jobs:
            return []
        if any(j.parent_id or j.depends_on or j.depends_on_batch for j in jobs):
            return await self._enqueue_linked(jobs)
        cols = _columns([(None, j, "queued", False) for j in jobs])
        async with self._conn() as conn, conn.transaction():
            keys = [j.idempotency_key for j in jobs if j.idempotency_key is not None]
            if keys:
                await conn.execute(Q_LOCK_KEYS, (KEY_LOCK_SPACE, keys))
                await conn.execute(Q_RELEASE_KEYS, (keys,))
            cur = await conn.execute(Q_ENQUEUE, cols)
            # Sequence values follow row order, so sorting by id restores input order.
            new = sorted((self._rows.job(r) for r in await cur.fetchall()), key=lambda j: j.id)
            existing: dict[str, Job] = {}
            new_keys = {j.idempotency_key for j in new if j.idempotency_key is not None}
            wanted = [
                j.idempotency_key
                for j in jobs
                if j.idempotency_key is not None and j.idempotency_key not in new_keys
            ]
            if wanted:
                cur = await conn.execute(
                    f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE idempotency_key = ANY(%s)",
                    (wanted,),
                )
                existing = {r["idempotency_key"]: self._rows.job(r) for r in await cur.fetchall()}
            await self._notify(conn, "tether_enqueued", sorted({j.queue for j in new}))
        out: list[Job] = []
        seen: dict[str, Job] = {}
        it = iter(new)
        for j in jobs:
            k = j.idempotency_key
            if k is not None and k in seen:
                out.append(seen[k])
            elif k is not None and k not in new_keys:
                out.append(existing[k])
                seen[k] = existing[k]
            else:
                job = next(it)
                out.append(job)
                if k is not None:
                    seen[k] = job
        return out

    async def _enqueue_linked(self, jobs: Sequence[NewJob]) -> list[Job]:
        """Jobs with dependencies or a parent, in a few statements however many there are.

        Ids are drawn from the sequence first, so that dependencies on earlier entries
        of the batch are known before anything is written.
        """
        async with self._conn() as conn, conn.transaction():
            keys = sorted({j.idempotency_key for j in jobs if j.idempotency_key is not None})
            existing: dict[str, Job] = {}
            if keys:
                await conn.execute(Q_LOCK_KEYS, (KEY_LOCK_SPACE, keys))
                await conn.execute(Q_RELEASE_KEYS, (keys,))
                cur = await conn.execute(
                    f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE idempotency_key = ANY(%s)",
                    (keys,),
                )
                existing = {r["idempotency_key"]: self._rows.job(r) for r in await cur.fetchall()}
            # Each entry stands for a new row, or for the job its idempotency key names.
            first: dict[str, int] = {}
            fresh = []
            for i, j in enumerate(jobs):
                k = j.idempotency_key
                if k is None or (k not in existing and k not in first):
                    fresh.append(i)
                    if k is not None:
                        first[k] = i
            cur = await conn.execute(
                "SELECT nextval('tether_jobs_id_seq') AS id FROM generate_series(1, %s)",
                (len(fresh),),
            )
            ids = [0] * len(jobs)
            for i, new_id in zip(fresh, sorted(r["id"] for r in await cur.fetchall()), strict=True):
                ids[i] = new_id
            for i, j in enumerate(jobs):
                k = j.idempotency_key
                if k is not None and k in existing:
                    ids[i] = existing[k].id
                elif k is not None and first[k] != i:
                    ids[i] = ids[first[k]]
            deps = {
                i: sorted({*jobs[i].depends_on, *(ids[b] for b in jobs[i].depends_on_batch)})
                for i in fresh
            }
            new_ids = {ids[i] for i in fresh}
            outside = sorted({d for ds in deps.values() for d in ds} - new_ids)
            found: dict[int, str] = {}
            if outside:
                # FOR SHARE: an upstream job cannot finish between this check and our
                # commit, so its trigger will see the new dependencies.
                cur = await conn.execute(
                    "SELECT id, state FROM tether_jobs WHERE id = ANY(%s) FOR SHARE", (outside,)
                )
                found = {r["id"]: r["state"] for r in await cur.fetchall()}
            # A new job of this batch has not succeeded: its dependents start blocked.
            found.update(dict.fromkeys(new_ids, "queued"))
            for ds in deps.values():
                check_dependencies(ds, found)
            upstream = {d for ds in deps.values() for d in ds}
            cols = _columns(
                [
                    (
                        ids[i],
                        jobs[i],
                        "blocked" if any(found[d] != "succeeded" for d in deps[i]) else "queued",
                        ids[i] in upstream,
                    )
                    for i in fresh
                ]
            )
            cur = await conn.execute(Q_ENQUEUE, cols)
            rows = {r["id"]: self._rows.job(r) for r in await cur.fetchall()}
            pairs = [(ids[i], d) for i in fresh for d in deps[i]]
            if pairs:
                await conn.execute(
                    "INSERT INTO tether_dependencies (job_id, depends_on) "
                    "SELECT * FROM unnest(%s::bigint[], %s::bigint[])",
                    ([a for a, _ in pairs], [b for _, b in pairs]),
                )
            if outside:
                await conn.execute(
                    "UPDATE tether_jobs SET has_dependents = true "
                    "WHERE id = ANY(%s) AND NOT has_dependents",
                    (outside,),
                )
            await self._notify(conn, "tether_enqueued", sorted({jobs[i].queue for i in fresh}))
        by_key = {k: rows[ids[i]] for k, i in first.items()}
        return [
            existing[j.idempotency_key]
            if j.idempotency_key in existing
            else by_key[j.idempotency_key]
            if j.idempotency_key is not None
            else rows[ids[i]]
            for i, j in enumerate(jobs)
        ]

    async def get(self, job_id: int) -> Job | None:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id = %s", (job_id,)
            )
            row = await cur.fetchone()
        return self._rows.job(row) if row else None

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        where: list[sql.Composable] = [sql.SQL("TRUE")]
        params: list[Any] = []
        if flt.states is not None:
            where.append(sql.SQL("state = ANY(%s)"))
            params.append([s.value for s in flt.states])
        for column in ("queue", "task", "key", "owner", "worker_id", "parent_id"):
            value = getattr(flt, column)
            if value is not None:
                where.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
                params.append(value)
        if flt.ids is not None:
            where.append(sql.SQL("id = ANY(%s)"))
            params.append(list(flt.ids))
        query = sql.SQL(
            "SELECT " + JOB_COLUMNS + " FROM tether_jobs WHERE {} ORDER BY id DESC "
            "LIMIT %s OFFSET %s"
        ).format(sql.SQL(" AND ").join(where))
        params.extend([flt.limit, flt.offset])
        async with self._conn() as conn:
            cur = await conn.execute(query, params)
            return [self._rows.job(r) for r in await cur.fetchall()]

    async def count_by_state(self) -> dict[str, int]:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT state, COUNT(*) AS n FROM tether_jobs GROUP BY state")
            return {r["state"]: r["n"] for r in await cur.fetchall()}

    async def events(self, job_id: int) -> list[JobEvent]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT * FROM tether_job_events WHERE job_id = %s ORDER BY id", (job_id,)
            )
            return [self._rows.event(r) for r in await cur.fetchall()]

    async def request_cancel(
        self,
        job_id: int,
        reason: str | None,
        force: bool,
        actor: str | None,
        cascade: bool = True,
    ) -> Job:
        args = {
            "id": job_id,
            "reason": reason,
            "force": force,
            "actor": actor,
            "cascade": cascade,
        }
        return await self._control(Q_CANCEL, args, job_id, "tether_cancel")

    async def _control(
        self, query: LiteralString, args: dict[str, Any], job_id: int, running_channel: str
    ) -> Job:
        # One statement, one round trip: the change, and (for a flag on a running job,
        # which the transition trigger does not see) the NOTIFY to its worker.
        wrapped: LiteralString = (
            "WITH u AS (" + query + "), n AS (SELECT pg_notify(%(channel)s, id::text) "
            "FROM u WHERE state = 'running') SELECT u.*, (SELECT count(*) FROM n) AS n FROM u"
        )
        async with self._conn() as conn:
            cur = await conn.execute(wrapped, {**args, "channel": running_channel})
            found = await cur.fetchone()
            if found is None:  # nothing to change: report the job as it is
                cur = await conn.execute(
                    f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id = %s", (job_id,)
                )
                found = await cur.fetchone()
        if found is None:
            raise JobNotFoundError(job_id)
        return self._rows.job(found)

    async def request_pause(self, job_id: int, reason: str | None, actor: str | None) -> Job:
        args = {"id": job_id, "reason": reason, "actor": actor}
        return await self._control(Q_PAUSE, args, job_id, "tether_control")

    async def resume(self, job_id: int, budget: int | None, actor: str | None) -> Job:
        args = {"id": job_id, "budget": budget, "actor": actor}
        return await self._control(Q_RESUME, args, job_id, "tether_control")

    async def retry(self, job_id: int, actor: str | None) -> Job:
        return await self._control(
            Q_RETRY, {"id": job_id, "actor": actor}, job_id, "tether_control"
        )

    # -- queues, limits, artifacts, cancellations ----------------------------------------

    async def set_queue_paused(self, name: str, paused: bool, reason: str | None) -> None:
        async with self._conn() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO tether_queues (name, paused, reason) VALUES (%s, %s, %s) "
                "ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, "
                "reason = excluded.reason, changed_at = now()",
                (name, paused, reason),
            )
            if not paused:
                await self._notify(conn, "tether_enqueued", [name])

    async def list_queues(self) -> list[QueueInfo]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT queue, state, COUNT(*) AS n FROM tether_jobs GROUP BY 1, 2"
            )
            counts: dict[str, dict[str, int]] = {}
            for r in await cur.fetchall():
                counts.setdefault(r["queue"], {})[r["state"]] = r["n"]
            cur = await conn.execute("SELECT name, paused, reason FROM tether_queues")
            flags = {r["name"]: (r["paused"], r["reason"]) for r in await cur.fetchall()}
        return [
            QueueInfo(name, *flags.get(name, (False, None)), counts.get(name, {}))
            for name in sorted(set(counts) | set(flags))
        ]

    async def define_limit(self, name: str, kind: str, capacity: int, block_on_hold: bool) -> None:
        async with self._conn() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO tether_limits (name, kind, capacity, block_on_hold) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
                "capacity = excluded.capacity, block_on_hold = excluded.block_on_hold",
                (name, kind, capacity, block_on_hold),
            )
            await self._notify(conn, "tether_enqueued", [h.ANY])

    async def list_limits(self) -> list[LimitInfo]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT l.*, (SELECT COUNT(*) FROM tether_jobs j WHERE j.key IS NOT NULL "
                "AND 'key:' || j.key = l.name AND j.state IN ('queued', 'retrying')) AS queued "
                "FROM tether_limits l ORDER BY l.name"
            )
            return [self._rows.limit(r) for r in await cur.fetchall()]

    async def waiting_by_task(self) -> dict[tuple[str, str], int]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT queue, task, COUNT(*) AS n FROM tether_jobs "
                "WHERE state IN ('queued', 'retrying') GROUP BY 1, 2"
            )
            return {(r["queue"], r["task"]): r["n"] for r in await cur.fetchall()}

    async def set_rate_limit(self, scope: str, name: str, per_second: float, burst: int) -> None:
        async with self._conn() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO tether_rate_limits (id, per_second, burst, tokens) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                "per_second = excluded.per_second, burst = excluded.burst, "
                "tokens = excluded.tokens, refilled_at = now()",
                (f"{scope}:{name}", per_second, burst, burst),
            )
            await self._notify(conn, "tether_enqueued", [h.ANY])
        self.hints.publish(h.ENQUEUED, [h.ANY])

    async def remove_rate_limit(self, scope: str, name: str) -> bool:
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(
                "DELETE FROM tether_rate_limits WHERE id = %s", (f"{scope}:{name}",)
            )
            await self._notify(conn, "tether_enqueued", [h.ANY])
        self.hints.publish(h.ENQUEUED, [h.ANY])
        return cur.rowcount > 0

    async def list_rate_limits(self) -> list[RateLimitInfo]:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT id, per_second, burst, {RATE_TOKENS} AS tokens "
                "FROM tether_rate_limits ORDER BY id"
            )
            return [
                RateLimitInfo(
                    r["id"].split(":", 1)[0],
                    r["id"].split(":", 1)[1],
                    r["per_second"],
                    r["burst"],
                    float(r["tokens"]),
                )
                for r in await cur.fetchall()
            ]

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
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO tether_cancellations (id, job_id, request_id, reason, force, "
                "cascade, initiated_by, status) VALUES (%s, %s, %s, %s, %s, %s, %s, 'initiated') "
                "ON CONFLICT DO NOTHING",
                (cancellation_id, job_id, request_id, reason, force, cascade, initiated_by),
            )
            created = cur.rowcount == 1
            cur = await conn.execute(
                "SELECT * FROM tether_cancellations WHERE job_id = %s OR "
                "(%s::text IS NOT NULL AND request_id = %s) ORDER BY id = %s DESC, "
                "status NOT IN ('completed', 'partial', 'failed') DESC, "
                "initiated_at DESC LIMIT 1",
                (job_id, request_id, request_id, cancellation_id),
            )
            row = await cur.fetchone()
        assert row is not None
        return self._rows.cancellation(row), created

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
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE tether_cancellations SET status = %s, steps = %s::jsonb, "
                "result = COALESCE(%s::jsonb, result), error = %s, "
                "completed_at = CASE WHEN %s THEN now() ELSE completed_at END "
                "WHERE id = %s AND (%s::text IS NULL OR status = %s) RETURNING job_id",
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
            )
            row = await cur.fetchone()
            if row is not None:
                await self._notify(conn, "tether_changed", [str(row["job_id"])])
        return row is not None

    async def get_cancellation(
        self, *, job_id: int | None, request_id: str | None
    ) -> CancellationRow | None:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT * FROM tether_cancellations WHERE job_id = %s OR "
                "(%s::text IS NOT NULL AND request_id = %s) ORDER BY initiated_at DESC LIMIT 1",
                (job_id, request_id, request_id),
            )
            row = await cur.fetchone()
        return self._rows.cancellation(row) if row else None

    async def list_cancellations(
        self, limit: int, offset: int, status: str | None = None
    ) -> list[CancellationRow]:
        async with self._conn() as conn:
            # Two statements, not one with an OR: the filtered one uses the partial index.
            if status is None:
                cur = await conn.execute(
                    "SELECT * FROM tether_cancellations ORDER BY initiated_at DESC, id "
                    "LIMIT %s OFFSET %s",
                    (limit, offset),
                )
            else:
                # A literal, so that even a prepared plan knows it may use the index.
                query = sql.SQL(
                    "SELECT * FROM tether_cancellations WHERE status = {} "
                    "ORDER BY initiated_at DESC, id LIMIT %s OFFSET %s"
                ).format(sql.Literal(status))
                cur = await conn.execute(query, (limit, offset))
            return [self._rows.cancellation(r) for r in await cur.fetchall()]

    async def list_stale_cancellations(
        self, older_than: float, limit: int
    ) -> list[CancellationRow]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT * FROM tether_cancellations "
                "WHERE status NOT IN ('completed', 'partial', 'failed') "
                "AND initiated_at <= now() - make_interval(secs => %s) "
                "ORDER BY initiated_at, id LIMIT %s",
                (older_than, limit),
            )
            return [self._rows.cancellation(r) for r in await cur.fetchall()]

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
        await self.listen()
        if self._listen_dsn is not None:
            # The session whose end tells that the worker died (see Q_DEAD_SESSIONS),
            # listening on the worker's channels before its first claim.
            self._sticky |= {"tether_enqueued", "tether_control", "tether_cancel"}
            await asyncio.wait_for(self._listening_on(self._sticky), 10)
        self._workers.add(worker_id)
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO tether_workers (id, name, host, pid, pid_start, boot_id, pid_ns, "
                "machine_id, backend_pid, queues, concurrency, state, tasks) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 'active', %s)",
                (
                    worker_id,
                    name,
                    host,
                    pid,
                    pid_start,
                    space.boot_id,
                    space.pid_ns,
                    space.machine_id,
                    self._backend_pid,
                    ",".join(queues),
                    concurrency,
                    json.dumps(sorted(tasks)) if tasks is not None else None,
                ),
            )

    async def set_worker_state(self, worker_id: str, state: str) -> None:
        if state in ("stopped", "dead"):
            self._workers.discard(worker_id)
        async with self._conn() as conn:
            await conn.execute(
                "UPDATE tether_workers SET state = %s, heartbeat_at = now() WHERE id = %s",
                (state, worker_id),
            )

    async def set_worker_threads(self, worker_id: str, abandoned: int, pool_full: bool) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "UPDATE tether_workers SET abandoned_threads = %s, thread_pool_full = %s "
                "WHERE id = %s",
                (abandoned, pool_full, worker_id),
            )

    async def list_workers(self) -> list[WorkerInfo]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT w.*, (SELECT COUNT(*) FROM tether_jobs j WHERE j.state = 'running' "
                "AND j.worker_id = w.id) AS running_jobs FROM tether_workers w "
                "ORDER BY w.started_at DESC"
            )
            return [self._rows.worker(r) for r in await cur.fetchall()]

    # -- maintenance ---------------------------------------------------------------------

    async def mark_dead_workers(self, process_gone: ProcessGone, session_grace: float) -> list[str]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT id, pid, pid_start, boot_id, pid_ns, machine_id FROM tether_workers "
                "WHERE state IN ('active', 'draining')"
            )
            dead = [r["id"] for r in await cur.fetchall() if process_gone(worker_process(r))]
            if dead:
                await conn.execute(
                    "UPDATE tether_workers SET state = 'dead' WHERE id = ANY(%s)", (dead,)
                )
            cur = await conn.execute(Q_DEAD_SESSIONS, (session_grace,))
            dead.extend(r["id"] for r in await cur.fetchall())
        return dead

    async def rescue(self) -> list[Job]:
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(Q_RESCUE)
            return [self._rows.job(r) for r in await cur.fetchall()]

    # -- workflows -----------------------------------------------------------------------

    async def spawn(self, parent_id: int, lease_token: int, job: NewJob) -> Job | None:
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(
                Q_SPAWN,
                {
                    "parent": parent_id,
                    "token": lease_token,
                    "task": job.task,
                    "args": job.args_json,
                    "queue": job.queue,
                    "priority": job.priority,
                    "key": job.key,
                    "max_attempts": job.max_attempts,
                    "timeout": job.timeout,
                    "delay": float(job.delay),
                    "idem": job.idempotency_key,
                    "budget": job.budget,
                    "limits": list(job.limits) or None,
                },
            )
            row = await cur.fetchone()
            if row is None:
                return None
            held = await self._lease_held(PostgresTx(conn), parent_id, lease_token, no_cancel=True)
            if not held:
                raise psycopg.Rollback()
            await conn.execute(
                "UPDATE tether_jobs SET has_children = true WHERE id = %s AND NOT has_children",
                (parent_id,),
            )
            await self._notify(conn, "tether_enqueued", [job.queue])
            return self._rows.job(row)
        return None  # rolled back: the lease was lost while the INSERT waited

    async def delete(self, job_id: int, actor: str | None) -> tuple[Job, list[Job]]:
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(
                f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id = %s FOR UPDATE", (job_id,)
            )
            row = await cur.fetchone()
            if row is None:
                raise JobNotFoundError(job_id)
            cur = await conn.execute(Q_CANCEL_CHILDREN, {"parent": job_id, "actor": actor})
            children = [self._rows.job(r) for r in await cur.fetchall()]
            # Settle the job itself first, so counters and dependents see it end.
            await conn.execute(
                Q_CANCEL,
                {
                    "id": job_id,
                    "reason": "job deleted",
                    "force": True,
                    "actor": actor,
                    "cascade": True,
                },
            )
            await conn.execute(
                "UPDATE tether_jobs SET state = 'cancelled', lease_token = lease_token + 1, "
                "lease_expires_at = NULL, finished_at = now(), actor = %s, reason = 'job deleted' "
                "WHERE id = %s AND state = 'running'",
                (actor, job_id),
            )
            await conn.execute("DELETE FROM tether_dependencies WHERE job_id = %s", (job_id,))
            await conn.execute("DELETE FROM tether_artifacts WHERE job_id = %s", (job_id,))
            await conn.execute("DELETE FROM tether_jobs WHERE id = %s", (job_id,))
        return self._rows.job(row), children

    async def downstream(self, job_ids: Sequence[int]) -> list[Job]:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id IN "
                "(SELECT id FROM tether_downstream(%s::bigint[])) ORDER BY id",
                (list(job_ids),),
            )
            return [self._rows.job(r) for r in await cur.fetchall()]

    async def dependencies(self, job_id: int) -> tuple[list[int], list[int]]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT depends_on AS id FROM tether_dependencies WHERE job_id = %s ORDER BY 1",
                (job_id,),
            )
            upstream = [r["id"] for r in await cur.fetchall()]
            cur = await conn.execute(
                "SELECT job_id AS id FROM tether_dependencies WHERE depends_on = %s ORDER BY 1",
                (job_id,),
            )
            downstream = [r["id"] for r in await cur.fetchall()]
        return upstream, downstream

    # -- notifications -------------------------------------------------------------------

    async def listen(self) -> None:
        """Start the LISTEN connection (idempotent); it reconnects by itself, and it
        listens on the channels its :attr:`hints` have subscribers for.

        Behind a pooler (``pgbouncer``) without a ``listen_url`` nothing listens: a
        pooled session cannot LISTEN, and waits poll instead."""
        if self._listen_dsn is None:
            return
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen_forever(), name="tether-listen")

    async def _listen_forever(self) -> None:
        loop = asyncio.get_running_loop()
        self._listen_delay, self._listen_failures = LISTEN_FIRST_DELAY, 0
        last_log = -1e9
        while True:
            problem = "LISTEN connection ended"
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._listen_dsn or self._dsn, autocommit=True, **self._listen_kwargs
                )
            except psycopg.Error as exc:
                problem = f"LISTEN connection failed: {exc}"
            else:
                try:
                    async with conn:
                        await self._serve(conn)
                except psycopg.Error as exc:
                    problem = f"LISTEN connection lost, reconnecting: {exc}"
                finally:
                    self._connected.clear()
                    self._backend_pid = None
            self._listen_failures += 1
            # Bounded logs while the database is down or refuses us: the first failure,
            # then one line every LOG_EVERY seconds.
            if self._listen_failures == 1 or loop.time() - last_log >= LOG_EVERY:
                last_log = loop.time()
                log.warning(
                    "%s (%d in a row, next try in %.1fs)",
                    problem.strip(),
                    self._listen_failures,
                    self._listen_delay,
                )
            await asyncio.sleep(self._listen_delay)
            # A connection that works for a moment and then fails (a read-only database
            # refuses our writes, say) must not reset the backoff: only a connection
            # that stayed healthy for LISTEN_HEALTHY seconds does (in _serve).
            self._listen_delay = min(self._listen_delay * 2, LISTEN_MAX_DELAY)

    async def _serve(self, conn: psycopg.AsyncConnection[Any]) -> None:
        loop = asyncio.get_running_loop()
        listening = self._listening = set()
        await self._follow_subscriptions(conn, listening)
        self._followed.set()
        self._backend_pid = conn.info.backend_pid
        if self._workers:
            await conn.execute(
                "UPDATE tether_workers SET backend_pid = %s WHERE id = ANY(%s)",
                (self._backend_pid, list(self._workers)),
            )
        self._connected.set()
        since = loop.time()
        # Anything published while we were away is lost: wake every waiter to re-check.
        self.hints.publish_all()
        pinged = renewed = -1e9
        while True:
            if loop.time() - pinged >= LISTEN_PING:
                pinged = loop.time()
                # A cheap round trip that also notices a dead connection, and a partition.
                async with self._bounded(conn):
                    await conn.execute("SELECT 1")
            if self._listen_failures and loop.time() - since >= LISTEN_HEALTHY:
                log.info(
                    "LISTEN connection healthy again after %d failed tries",
                    self._listen_failures,
                )
                self._listen_delay, self._listen_failures = LISTEN_FIRST_DELAY, 0
            if await self._follow_subscriptions(conn, listening):
                renewed = -1e9
            self._followed.set()
            if CHANGED_CHANNEL in listening and loop.time() - renewed >= LISTENER_RENEW:
                renewed = loop.time()
                await self._renew_listener(conn, CHANGED_CHANNEL)
            async for note in conn.notifies(timeout=LISTEN_SYNC):
                target = CHANNELS.get(note.channel)
                if target is not None:
                    self.hints.publish(target, note.payload.split(","))

    async def _listening_on(self, channels: set[str]) -> None:
        """Wait until the LISTEN connection is up and listens on ``channels``."""
        while True:
            self._followed.clear()
            if self._connected.is_set() and channels <= self._listening:
                return
            await self._followed.wait()

    async def _follow_subscriptions(
        self, conn: psycopg.AsyncConnection[Any], listening: set[str]
    ) -> bool:
        """LISTEN on the channels this process has subscribers for, and only those: a
        worker does not hear every transition of the fleet. True if any was added."""
        wanted = self._sticky | {
            SERVER_CHANNELS[c] for c in self.hints.channels() if c in SERVER_CHANNELS
        }
        for channel in sorted(listening - wanted):
            await conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
            listening.discard(channel)
        added = sorted(wanted - listening)
        for channel in added:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            listening.add(channel)
        return bool(added)

    async def _renew_listener(self, conn: psycopg.AsyncConnection[Any], channel: str) -> None:
        """Say (for LISTENER_TTL seconds) that this process listens on ``channel``."""
        try:
            await conn.execute(
                "INSERT INTO tether_listeners (channel, until) "
                "VALUES (%s, now() + make_interval(secs => %s)) ON CONFLICT (channel) "
                "DO UPDATE SET until = GREATEST(tether_listeners.until, excluded.until)",
                (channel, LISTENER_TTL),
            )
        except psycopg.Error as exc:
            if exc.sqlstate is None or exc.sqlstate.startswith("08"):
                raise
            # The server refused (read-only after a failover, an older schema): the
            # waits poll, and the next renewal tries again.
            log.debug("could not announce the %s listener: %s", channel, exc)

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
        where: list[sql.Composable] = [sql.SQL("e.id > %s")]
        params: list[Any] = [after_id]
        for column, value in (("job_id", job_id), ("queue", queue), ("owner", owner)):
            if value is not None:
                table = "e" if column == "job_id" else "j"
                where.append(sql.SQL("{}.{} = %s").format(sql.SQL(table), sql.Identifier(column)))
                params.append(value)
        if states is not None:
            where.append(sql.SQL("e.to_state = ANY(%s)"))
            params.append(list(states))
        query = sql.SQL(
            "SELECT e.*, j.queue AS job_queue, j.task AS job_task, j.owner AS job_owner "
            "FROM tether_job_events e LEFT JOIN tether_jobs j ON j.id = e.job_id "
            "WHERE {} ORDER BY e.id LIMIT %s"
        ).format(sql.SQL(" AND ").join(where))
        params.append(limit)
        async with self._conn() as conn:
            cur = await conn.execute(query, params)
            return [self._api.feed(r) for r in await cur.fetchall()]

    async def last_event_id(self) -> int:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT COALESCE(MAX(id), 0) AS n FROM tether_job_events")
            row = await cur.fetchone()
        return int(row["n"]) if row else 0

    async def list_owned_cancellations(
        self, owner: str, limit: int, offset: int
    ) -> list[CancellationRow]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT c.* FROM tether_cancellations c JOIN tether_jobs j ON j.id = c.job_id "
                "WHERE j.owner = %s ORDER BY c.initiated_at DESC, c.id LIMIT %s OFFSET %s",
                (owner, limit, offset),
            )
            return [self._rows.cancellation(r) for r in await cur.fetchall()]

    # -- maintenance: the leader's lease and retention ---------------------------------

    async def db_time(self) -> datetime:
        """The database clock, which leases and schedules go by."""
        async with self._conn() as conn:
            cur = await conn.execute("SELECT now() AS now")
            row = await cur.fetchone()
        assert row is not None
        now: datetime = row["now"]
        return now

    async def lead(self, name: str, holder: str, ttl: float) -> LeaderInfo:
        async with self._conn() as conn:
            await conn.execute(Q_LEAD, {"name": name, "holder": holder, "ttl": ttl})
            info = await self._leader(conn, name)
        assert info is not None
        return info

    async def _leader(self, conn: Conn, name: str) -> LeaderInfo | None:
        cur = await conn.execute(
            "SELECT name, holder, since, expires_at, expires_at >= now() AS active "
            "FROM tether_leaders WHERE name = %s",
            (name,),
        )
        row = await cur.fetchone()
        if row is None:
            return None
        return LeaderInfo(
            row["name"], row["holder"], row["since"], row["expires_at"], row["active"]
        )

    async def resign(self, name: str, holder: str) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "DELETE FROM tether_leaders WHERE name = %s AND holder = %s", (name, holder)
            )

    async def get_leader(self, name: str) -> LeaderInfo | None:
        async with self._conn() as conn:
            return await self._leader(conn, name)

    async def prune_jobs(
        self,
        state: str,
        older_than: float,
        limit: int,
        after: tuple[object, int] | None,
        dry_run: bool,
    ) -> PruneBatch:
        params: dict[str, Any] = {"state": state, "age": older_than, "limit": limit}
        query = Q_PRUNE_PICK
        if after is not None:
            query = Q_PRUNE_PICK_AFTER
            params.update(after_at=after[0], after_id=after[1])
        if not dry_run:
            # Rows another pruner is deleting are skipped, not waited for.
            query = query + " FOR UPDATE SKIP LOCKED"
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(query, params)
            rows = await cur.fetchall()
            if not rows:
                return PruneBatch({}, 0)
            ids = [r["id"] for r in rows]
            linked = [r["id"] for r in rows if r["linked"]]
            kept: set[int] = set()
            if linked:
                cur = await conn.execute(Q_IN_LIVE_WORKFLOW, {"ids": linked})
                kept = {r["id"] for r in await cur.fetchall()}
            doomed = [i for i in ids if i not in kept]
            counts = {}
            for kind, table, where in _PRUNE_TABLES:
                if dry_run:
                    cur = await conn.execute(
                        f"SELECT count(*) AS n FROM {table} WHERE {where}", {"ids": doomed}
                    )
                    row = await cur.fetchone()
                    counts[kind] = int(row["n"]) if row else 0
                else:
                    cur = await conn.execute(f"DELETE FROM {table} WHERE {where}", {"ids": doomed})
                    counts[kind] = cur.rowcount
        last = rows[-1]
        return PruneBatch(counts, len(rows), len(kept), (last["finished_at"], last["id"]))

    async def prune_rows(self, kind: str, older_than: float, limit: int, dry_run: bool) -> int:
        if kind == "audit":
            pick: LiteralString = (
                "SELECT id FROM tether_audit WHERE at < now() - make_interval(secs => %(age)s) "
                "ORDER BY at"
            )
            table: LiteralString = "tether_audit"
        elif kind == "workers":
            pick = (
                "SELECT id FROM tether_workers w WHERE state IN ('stopped', 'dead') "
                "AND heartbeat_at < now() - make_interval(secs => %(age)s) "
                "AND NOT EXISTS (SELECT 1 FROM tether_jobs j WHERE j.state = 'running' "
                "AND j.worker_id = w.id) ORDER BY heartbeat_at"
            )
            table = "tether_workers"
        else:
            raise ValueError(f"unknown kind of rows to prune: {kind!r}")
        async with self._conn() as conn:
            if dry_run:
                cur = await conn.execute(
                    "SELECT count(*) AS n FROM (" + pick + ") AS old", {"age": older_than}
                )
                row = await cur.fetchone()
                return int(row["n"]) if row else 0
            cur = await conn.execute(
                "DELETE FROM " + table + " WHERE id IN (" + pick + " LIMIT %(limit)s)",
                {"age": older_than, "limit": limit},
            )
            return cur.rowcount

    # -- periodic schedules --------------------------------------------------------------

    async def sync_schedule(
        self, name: str, task: str, cron: str, timezone: str, start: datetime
    ) -> ScheduleRow:
        async with self._conn() as conn:
            cur = await conn.execute(
                "INSERT INTO tether_schedules (name, task, cron, timezone, last_tick) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
                "task = EXCLUDED.task, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone "
                "RETURNING *",
                (name, task, cron, timezone, start),
            )
            row = await cur.fetchone()
        assert row is not None
        return _schedule(row)

    async def advance_schedule(
        self, name: str, tick: datetime, next_tick: datetime | None, job_id: int | None
    ) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE tether_schedules SET last_tick = %(tick)s, next_tick = %(next)s, "
                "last_job_id = COALESCE(%(job)s, last_job_id), "
                "last_run_at = CASE WHEN %(job)s::bigint IS NULL THEN last_run_at ELSE now() END "
                "WHERE name = %(name)s AND (last_tick IS NULL OR last_tick < %(tick)s)",
                {"tick": tick, "next": next_tick, "job": job_id, "name": name},
            )
            return cur.rowcount > 0

    async def list_schedules(self) -> list[ScheduleRow]:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT * FROM tether_schedules ORDER BY name")
            return [_schedule(r) for r in await cur.fetchall()]

    async def set_schedule_paused(self, name: str, paused: bool) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE tether_schedules SET paused = %s WHERE name = %s", (paused, name)
            )
            return cur.rowcount > 0


class CallerPostgresStore(PostgresStore):
    """A store whose statements run in the caller's transaction, on its own connection.

    The ordinary store code runs on the caller's psycopg connection (async or blocking)
    inside a savepoint, so the rows and their NOTIFY commit or roll back with the
    caller's own writes (PostgreSQL delivers a NOTIFY at commit), and a failure leaves
    the caller's transaction usable.
    """

    def __init__(
        self, url: str, conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]
    ) -> None:
        # No pool and no listener: every statement uses the caller's connection.
        self.url = url
        self.hints = Hints()
        self._opened = True
        self._rows = RowReader(text_json=False, epoch_times=False)
        self._listener = None
        self._caller = conn

    async def open(self) -> None:
        pass  # the caller owns the connection

    async def close(self) -> None:
        pass

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[dict[str, Any]]]:
        caller: Any = self._caller
        status = caller.info.transaction_status
        if status == psycopg.pq.TransactionStatus.INERROR:
            raise InvalidJobError("the connection's transaction has failed; roll it back first")
        if status == psycopg.pq.TransactionStatus.IDLE and caller.autocommit:
            raise InvalidJobError(
                "the connection is in autocommit mode outside a transaction; enqueue inside "
                "`with conn.transaction():` so the job commits with your writes"
            )
        face: Any = caller if isinstance(caller, psycopg.AsyncConnection) else _BlockingFace(caller)
        saved = caller.row_factory
        caller.row_factory = dict_row
        try:
            if status == psycopg.pq.TransactionStatus.IDLE:
                # A transaction block on an idle connection would commit at its end;
                # any statement opens the caller's implicit transaction instead.
                await face.execute("SELECT 1")
            yield face
        except psycopg.Error as exc:
            raise StoreError(f"postgresql: {exc}") from exc
        finally:
            caller.row_factory = saved


class _BlockingFace:
    """The async calls the store makes, on a blocking psycopg connection. Each statement
    blocks its thread, which is the caller's, and the caller is waiting for it anyway."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    async def execute(self, query: Any, params: Any = None) -> _BlockingCursor:
        return _BlockingCursor(self._conn.execute(query, params))

    def cursor(self, row_factory: Any) -> _BlockingCursor:
        return _BlockingCursor(self._conn.cursor(row_factory=row_factory))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self._conn.transaction():
            yield


class _BlockingCursor:
    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    async def execute(self, query: Any, params: Any = None) -> _BlockingCursor:
        self._cur.execute(query, params)
        return self

    async def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    async def fetchone(self) -> Any:
        return self._cur.fetchone()


# Take the lease if it is free or ran out; renew it if it is ours.
Q_LEAD: LiteralString = """
INSERT INTO tether_leaders (name, holder, since, expires_at)
VALUES (%(name)s, %(holder)s, now(), now() + make_interval(secs => %(ttl)s))
ON CONFLICT (name) DO UPDATE SET
    since = CASE WHEN tether_leaders.holder = EXCLUDED.holder THEN tether_leaders.since
            ELSE EXCLUDED.since END,
    holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE tether_leaders.holder = EXCLUDED.holder OR tether_leaders.expires_at < now()
"""

_PRUNE_PICK: LiteralString = """
SELECT id, finished_at, parent_id IS NOT NULL OR has_children OR has_dependents
       OR EXISTS (SELECT 1 FROM tether_dependencies d WHERE d.job_id = j.id) AS linked
FROM tether_jobs j
WHERE state = %(state)s AND finished_at < now() - make_interval(secs => %(age)s)
  -- A failed job that holds its concurrency key stays until a person acts.
  AND NOT (state = 'failed' AND limits IS NOT NULL AND EXISTS (
      SELECT 1 FROM tether_limits l WHERE l.name = ANY(j.limits) AND l.kind = 'key'
      AND l.block_on_hold))
"""
Q_PRUNE_PICK: LiteralString = _PRUNE_PICK + "ORDER BY state, finished_at, id LIMIT %(limit)s"
Q_PRUNE_PICK_AFTER: LiteralString = (
    _PRUNE_PICK
    + "AND (finished_at, id) > (%(after_at)s, %(after_id)s) "
    + "ORDER BY state, finished_at, id LIMIT %(limit)s"
)

# The jobs a pruning batch deletes with their rows elsewhere, or counts in a dry run.
_PRUNE_TABLES: tuple[tuple[str, LiteralString, LiteralString], ...] = (
    ("events", "tether_job_events", "job_id = ANY(%(ids)s::bigint[])"),
    (
        "dependencies",
        "tether_dependencies",
        "job_id = ANY(%(ids)s::bigint[]) OR depends_on = ANY(%(ids)s::bigint[])",
    ),
    ("artifacts", "tether_artifacts", "job_id = ANY(%(ids)s::bigint[])"),
    ("cancellations", "tether_cancellations", "job_id = ANY(%(ids)s::bigint[])"),
    ("jobs", "tether_jobs", "id = ANY(%(ids)s::bigint[])"),
)

# Every job connected to the seeds through parents, children and dependencies, either way.
_NEIGHBOURS: LiteralString = """
CROSS JOIN LATERAL (
    SELECT j.parent_id AS id FROM tether_jobs j WHERE j.id = r.id AND j.parent_id IS NOT NULL
    UNION ALL SELECT c.id FROM tether_jobs c WHERE c.parent_id = r.id
    UNION ALL SELECT d.depends_on FROM tether_dependencies d WHERE d.job_id = r.id
    UNION ALL SELECT d.job_id FROM tether_dependencies d WHERE d.depends_on = r.id
) AS x
"""

# Those of the ids whose workflow has an active member. Two walks: everything connected
# to the ids, then everything connected to the active jobs found there. Each costs the
# size of the workflows touched, not of the table.
Q_IN_LIVE_WORKFLOW: LiteralString = (
    """
WITH RECURSIVE reach(id) AS (
    SELECT unnest(%(ids)s::bigint[])
    UNION SELECT x.id FROM reach r """
    + _NEIGHBOURS
    + """
), live(id) AS (
    SELECT j.id FROM tether_jobs j WHERE j.id IN (SELECT id FROM reach)
        AND j.state IN ('queued', 'blocked', 'running', 'retrying', 'paused')
    UNION SELECT x.id FROM live r """
    + _NEIGHBOURS
    + """
)
SELECT id FROM live WHERE id = ANY(%(ids)s::bigint[])
"""
)


def _schedule(row: dict[str, Any]) -> ScheduleRow:
    return ScheduleRow(
        name=row["name"],
        task=row["task"],
        cron=row["cron"],
        timezone=row["timezone"],
        paused=row["paused"],
        last_tick=row["last_tick"],
        next_tick=row["next_tick"],
        last_run_at=row["last_run_at"],
        last_job_id=row["last_job_id"],
    )
