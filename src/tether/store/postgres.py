"""The PostgreSQL store: psycopg 3 with a connection pool, SKIP LOCKED and LISTEN/NOTIFY.

Batch operations send arrays and run as one statement. NOTIFY carries ids and queue
names only, once per statement. One extra connection per store listens for
notifications.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import struct
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from tether.config import DEFAULT_POOL_SIZE, POOL_MAX_IDLE, StoreConfig
from tether.errors import ConfigError, InvalidJobError, RowLocked, StoreError
from tether.hints import Hints
from tether.procinfo import hostname
from tether.store.api_rows import ApiRowReader
from tether.store.common import SqlStore
from tether.store.driver import LOCK_WAIT, Body, T
from tether.store.postgres_tx import CHANNELS, SERVER_CHANNELS, PostgresTx
from tether.store.rows import (
    RowReader,
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


# How long a background transaction (one run under LOCK_WAIT) may sit idle between its
# statements before the server ends its session, releasing its locks: far more than a
# loaded client needs between two statements, far less than a lease.
IDLE_IN_TRANSACTION_MS = 5000

# The server keeps this many bytes of a session's application_name.
APPLICATION_NAME_BYTES = 63

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


def session_name() -> str:
    """The ``application_name`` of this process's sessions, unless the URL (or
    ``PGAPPNAME``) names them: ``tether <host>:<pid>``, which starts the id of every
    worker the process runs, so that ``pg_stat_activity`` tells whose each session is.
    A long host name is cut to fit, never the pid."""
    pid = f":{os.getpid()}"
    room = APPLICATION_NAME_BYTES - len("tether ") - len(pid)
    host = hostname().encode()[:room].decode(errors="ignore")
    return f"tether {host}{pid}"


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


class _Pool(AsyncConnectionPool[Conn]):
    """psycopg_pool's pool, whose :meth:`resize` to a smaller ``max_size`` also closes
    the connections beyond it: the idle ones at once, the lent ones as they come back.

    The library's own resize (3.3) leaves them open, to close one at a time only after a
    whole ``max_idle`` in which the pool never needed it, which the overlapping calls of
    an idle worker's loops never give it (see :meth:`PostgresStore.worker_idle`). This
    reads the pool's private counters under its lock, as its own ``_shrink_pool`` does;
    ``tests/integration/test_connections.py`` holds the behaviour against the pinned
    version (``constraints.txt``).
    """

    async def resize(self, min_size: int, max_size: int | None = None) -> None:
        await super().resize(min_size, max_size)
        await self._close_excess()

    async def putconn(self, conn: Conn) -> None:
        await super().putconn(conn)
        await self._close_excess()

    async def _close_excess(self) -> None:
        if self._nconns <= self._max_size:
            return  # every call but those just after a narrowing: no lock taken
        excess: list[Conn] = []
        async with self._lock:
            while self._nconns > self._max_size and self._pool:
                excess.append(self._pool.pop())
                self._nconns -= 1
            self._nconns_min = min(self._nconns_min, len(self._pool))
        for conn in excess:
            await self._close_connection(conn)


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
            "fallback_application_name": session_name(),
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
        self._pool_size = cfg.pool_size or DEFAULT_POOL_SIZE
        self._pool = _Pool(
            self._dsn,
            min_size=1,
            max_size=self._pool_size,
            # Beyond the one it keeps, a connection closes after this long unused: a
            # process without workers (a producer, ``tether serve``) goes back to one
            # pooled connection when its calls stop overlapping. A worker's pool is
            # narrowed outright while it idles (see worker_idle).
            max_idle=POOL_MAX_IDLE,
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
        # The workers of this store that are idle (worker_idle), and the pool's sizes
        # (min, max): as applied, and as wanted (see _want_sizes).
        self._idle_workers: set[str] = set()
        self._sizes = self._sizes_wanted = (1, self._pool_size)
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
        if self._sizes != self._sizes_wanted:
            await self._fit_pool()
        try:
            async with self._pool.connection() as conn, self._bounded(conn):
                yield conn
        except psycopg.errors.LockNotAvailable as exc:
            raise RowLocked(f"postgresql: a row stayed locked by another session: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"postgresql: {exc}") from exc

    async def _query(self, body: Body[T]) -> T:
        # Reads take no row locks: no bound on lock waits needed (see _change).
        async with self._conn() as conn:
            return await body(PostgresTx(conn))

    async def _change(self, body: Body[T]) -> T:
        if LOCK_WAIT.get() is not None:
            return await self._transact(body)  # SET LOCAL needs a transaction
        return await self._query(body)

    async def _transact(self, body: Body[T]) -> T:
        wait = LOCK_WAIT.get()
        async with self._conn() as conn, conn.transaction():
            if wait is not None:
                # A bound on row-lock waits for this transaction only (see LOCK_WAIT).
                # And as this wraps in a transaction what might have been a single
                # statement: a client cut off between its statements and its COMMIT
                # (a partition) must not leave its row locks held for the others to
                # skip or time out on, so the server ends such a session soon.
                await conn.execute(
                    "SELECT set_config('lock_timeout', %s, true), "
                    "set_config('idle_in_transaction_session_timeout', %s, true)",
                    (f"{max(1, round(wait * 1000))}ms", f"{IDLE_IN_TRANSACTION_MS}ms"),
                )
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

    # -- workers -------------------------------------------------------------------------

    # The worker's row (WorkersSql) records the backend pid of this store's LISTEN
    # session (_backend_pid), which DEAD_SESSIONS watches: SQLite has no such session.
    async def _worker_session(self, worker_id: str) -> None:
        await self.listen()
        if self._listen_dsn is not None:
            # The session whose end tells that the worker died (see DEAD_SESSIONS in
            # sql/postgres/maintenance.py), listening on the worker's channels before its
            # first claim.
            self._sticky |= {"tether_enqueued", "tether_control", "tether_cancel"}
            await asyncio.wait_for(self._listening_on(self._sticky), 10)
        # A new LISTEN session writes its pid into the rows of these workers (_serve).
        self._workers.add(worker_id)
        self._want_sizes()  # a new worker is busy until its first claim finds nothing

    def _worker_gone(self, worker_id: str) -> None:
        self._workers.discard(worker_id)
        self._idle_workers.discard(worker_id)
        self._want_sizes()  # the pool is fitted at its next call (_conn)

    # -- the pool's size -----------------------------------------------------------------

    async def worker_idle(self, worker_id: str, idle: bool) -> None:
        """While every worker of this store is idle, its pool holds one connection
        (beside the LISTEN one); as soon as one is busy, up to ``pool_size`` again.

        An idle worker's loops (claim poll, heartbeat, leader renewal, the leader's
        duties) each call on their own timer, and when two calls overlap a pool of two
        opens its second connection, which then stays (it closes only after a whole
        ``max_idle`` unused). Narrowed, the later call waits for the connection instead,
        for as long as the earlier one takes: milliseconds, or one batch of the leader's
        pruner (its ``batch_size`` rows). That wait costs no lease, as an idle worker
        holds none. What it could delay is the worker row's heartbeat, which only says
        the worker is alive: one given up after its timeout (``heartbeat_interval``)
        makes the claimer wait for the next one that gets through, and a stale
        heartbeat alone never has a worker presumed dead (its process or its LISTEN
        session must be gone too). And the leader's renewal, whose lease lasts
        ``leader_ttl``, three renewal intervals by default. Widening opens the second
        connection at once, for the burst's calls that overlap (a busy worker holds
        two pooled connections); without workers the pool is as opened again.
        """
        if idle:
            self._idle_workers.add(worker_id)
        else:
            self._idle_workers.discard(worker_id)
        self._want_sizes()
        if self._sizes != self._sizes_wanted:
            await self._fit_pool()

    def _want_sizes(self) -> None:
        size = self._pool_size
        if not self._workers:
            self._sizes_wanted = (1, size)  # a producer's or a server's pool, as opened
        elif self._workers <= self._idle_workers:
            self._sizes_wanted = (1, 1)
        else:
            # Busy: the second connection opens now, while the first claim's jobs start,
            # not when the burst's calls first overlap and would wait for it (a drain of
            # 8 workers was about 10% slower that way).
            self._sizes_wanted = (min(2, size), size)

    async def _fit_pool(self) -> None:
        if not self._opened:
            return  # opened as (1, pool_size); fitted at the first call
        self._sizes = self._sizes_wanted
        await self._pool.resize(*self._sizes)

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
