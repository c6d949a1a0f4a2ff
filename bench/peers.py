"""Peer job queues measured on this machine, so tether's figures sit beside theirs.

For the drains (``bench/drain.py``), this module prepares each peer's database (its
schema and ``n`` no-op jobs, enqueued *untimed*), says how to count the jobs it has
finished, and checks the end state; the consumers themselves run in processes of their
own (``bench/consumers.py``). ``cancel_latency_pgqueuer`` times how long PgQueuer takes
to deliver a cancellation request to a running job (in one process, as PgQueuer's own
figure is taken).

Settings (``bench/run.py`` pairs them with tether's: defaults with defaults, tuned with
tuned, the tuned values found by its ``--sweep``):

* PgQueuer 1.6.0 - ``QueueManager`` consumers, each in its own process on its own asyncpg
  connection (PgQueuer's preferred driver; ``driver="psycopg"`` is available but far
  slower, see ``pgq_driver``), ``batch_size`` 10 by default (the library default, and
  what PgQueuer's own drain benchmark uses) or the tuned value, no concurrency cap
  (``max_concurrent_tasks=None``, the default), default durable (logged) tables. A job
  is finished once its ``successful`` row is in ``pgqueuer_log`` (PgQueuer deletes the
  job from its queue table and logs it in one statement, in batches).
* Procrastinate 3.x - one worker process (``PsycopgConnector``), ``concurrency=10`` async
  slots, LISTEN/NOTIFY on, default ``delete_jobs="never"``; finished: ``succeeded``.
* Huey - ``SqliteHuey`` (WAL journal, huey's default) with ``PRAGMA synchronous`` set to the
  level tether's SQLite store runs at in the same pairing (``normal`` or ``full``; huey's own
  ``fsync`` option knows only FULL and OFF, so ``_SyncSqliteStorage`` sets the pragma on
  each of its connections), enqueued one task at a time (huey has no bulk enqueue), drained
  by huey's own ``Consumer`` with thread workers in a process of its own. A no-op returns
  ``None``, which huey does not store (``store_none=False``, its default), so nothing is
  written when a task finishes: huey deletes a task's row when a worker takes it, and the
  count of finished tasks is the count of rows gone from its queue table.

Run by hand: ``python bench/peers.py --dsn postgresql://postgres@127.0.0.1:5432/test``
(PgQueuer's cancellation latency; the drains are ``bench/run.py --only drain``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import statistics
import sys
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import procrastinate
    from pgqueuer.db import Driver

#: Which PostgreSQL client PgQueuer runs on; see ``pgq_driver``.
PgqDriverName = Literal["asyncpg", "psycopg"]

#: Default wall-clock limit for one measurement; a stuck peer raises instead of hanging.
DEFAULT_TIMEOUT = 300.0
#: How long a peer gets to stop gracefully after its timeout before it is cancelled.
_STOP_GRACE = 10.0

PGQ_BATCH_SIZE = 10
PGQ_DRIVER: PgqDriverName = "asyncpg"
PROCRASTINATE_CONCURRENCY = 10
HUEY_WORKERS = 4
#: How long ``fresh_database`` keeps trying to drop its database while the server is down.
DROP_PATIENCE = 60.0

# Enqueue in chunks so one INSERT never carries an unbounded parameter array.
_ENQUEUE_CHUNK = 10_000

#: The no-op job every peer drains, under this name.
NOOP = "tether_bench_noop"
_SLEEPER = "tether_bench_sleeper"


class PeerTimeoutError(RuntimeError):
    """A peer queue did not finish its measurement within the allowed time."""


class PeerCheckError(RuntimeError):
    """A peer queue finished, but not with every job done exactly as expected."""


def _check_count(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def _chunks(n: int, size: int = _ENQUEUE_CHUNK) -> Iterator[int]:
    """Yield the sizes of consecutive chunks that add up to ``n``."""
    while n > 0:
        step = min(n, size)
        yield step
        n -= step


async def _run_bounded(
    coro: Awaitable[None],
    *,
    time_limit: float,
    what: str,
    progress: Callable[[], str],
    stop: Callable[[], None] | None = None,
) -> None:
    """Await ``coro`` for at most ``time_limit`` seconds; on expiry stop it and raise.

    ``stop`` asks the peer to shut down gracefully; if it does not within a grace period
    (or there is no ``stop``), its task is cancelled. Either way nothing is left running.
    """
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=time_limit)
        if task in done:
            task.result()
            return
        if stop is not None:
            stop()
            await asyncio.wait({task}, timeout=_STOP_GRACE)
        raise PeerTimeoutError(f"{what} did not finish within {time_limit:g} s ({progress()})")
    finally:
        if not task.done():
            task.cancel()
            # Wait for the cancellation to land so no task outlives this call, but bounded:
            # a peer that swallows cancellation must not turn a timeout into a hang.
            await asyncio.wait({task}, timeout=_STOP_GRACE)
        if task.done() and not task.cancelled():
            # Retrieve any exception so it is not reported as never retrieved.
            task.exception()


@contextlib.asynccontextmanager
async def pgq_driver(dsn: str, driver: PgqDriverName) -> AsyncIterator[Driver]:
    """Open one dedicated connection for PgQueuer and wrap it in the named driver.

    asyncpg is PgQueuer's own first choice (its CLI tries asyncpg before psycopg, and its
    docs recommend a dedicated asyncpg connection for a QueueManager). Its psycopg driver
    shares one connection between queries and a LISTEN watcher that holds the connection
    lock while waiting, which on this machine made drains roughly 12x slower - so psycopg
    is available for comparison but is not the default.
    """
    if driver == "asyncpg":
        try:
            import asyncpg  # type: ignore[import-untyped]
        except ImportError as exc:
            raise RuntimeError(
                "PgQueuer's benchmark runs on asyncpg, which is not installed: install "
                "'pgqueuer[asyncpg]==1.6.0' (or pass driver='psycopg' to measure the much "
                "slower psycopg driver instead)"
            ) from exc
        from pgqueuer import AsyncpgDriver

        conn = await asyncpg.connect(**_asyncpg_connect_args(dsn))
        try:
            yield AsyncpgDriver(conn)
        finally:
            await conn.close()
    elif driver == "psycopg":
        import psycopg
        from pgqueuer import PsycopgDriver

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as pconn:
            yield PsycopgDriver(pconn)
    else:
        raise ValueError(f"unknown PgQueuer driver {driver!r}; use 'asyncpg' or 'psycopg'")


def _asyncpg_connect_args(dsn: str) -> dict[str, Any]:
    """Turn a libpq DSN (URL or key=value) into ``asyncpg.connect`` arguments.

    asyncpg parses only the URL form, while tether and psycopg accept both.
    """
    if "://" in dsn:
        return {"dsn": dsn}
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "password": "password"}
    args: dict[str, Any] = {new: params[old] for old, new in names.items() if old in params}
    if "dbname" in params:
        args["database"] = params["dbname"]
    return args


#: PgQueuer's finished jobs: their ``successful`` rows in its log table.
PGQ_FINISHED = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"


async def enqueue_pgqueuer(dsn: str, n: int, driver: PgqDriverName = PGQ_DRIVER) -> None:
    """Install PgQueuer's schema into ``dsn`` (a fresh, empty database) and enqueue ``n``
    no-op jobs in bulk."""
    from pgqueuer import Queries

    _check_count("n", n)
    async with pgq_driver(dsn, driver) as conn:
        queries = Queries(conn)
        await queries.install()
        for size in _chunks(n):
            await queries.enqueue([NOOP] * size, [None] * size, [0] * size)


async def check_pgqueuer(dsn: str, n: int, ran: int) -> None:
    """Raise ``PeerCheckError`` unless the queue is empty, ``n`` jobs are logged
    ``successful`` and the consumers ran the handler ``n`` times."""
    async with pgq_driver(dsn, PGQ_DRIVER) as conn:
        left = await conn.fetch("SELECT count(*) AS c FROM pgqueuer")
        ok = await conn.fetch(PGQ_FINISHED.replace("count(*)", "count(*) AS c"))
    rows, successful = int(str(left[0]["c"])), int(str(ok[0]["c"]))
    if ran != n or rows != 0 or successful != n:
        raise PeerCheckError(
            f"PgQueuer: {ran} jobs ran, {rows} rows left in the queue, "
            f"{successful} logged successful; expected {n}, 0, {n}"
        )


async def cancel_latency_pgqueuer(
    dsn: str,
    samples: int,
    *,
    settle: float = 0.05,
    driver: PgqDriverName = PGQ_DRIVER,
    time_limit: float = DEFAULT_TIMEOUT,
) -> list[float]:
    """Measure PgQueuer's cancellation latency for running jobs; return seconds per sample.

    ``dsn`` must name a fresh, empty database. One QueueManager runs a job that waits
    inside its ``Context.cancellation`` scope (PgQueuer's documented pattern); ``settle``
    seconds after the job has started, cancellation is requested on a separate connection
    with ``Queries.mark_job_as_cancelled``. A sample is the time from that call until the
    job's code sees the scope cancelled. Samples are taken one at a time. The whole
    measurement is bounded by ``time_limit`` (``PeerTimeoutError``).
    """
    from pgqueuer import Queries, QueueManager
    from pgqueuer.models import Context, Job

    _check_count("samples", samples)
    deadline = time.monotonic() + time_limit
    latencies: list[float] = []
    started = asyncio.Event()
    observed = asyncio.Event()
    observed_at: dict[int, float] = {}

    async def wait_or_timeout(event: asyncio.Event, what: str) -> None:
        try:
            await asyncio.wait_for(event.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise PeerTimeoutError(
                f"PgQueuer cancel latency: {what} within {time_limit:g} s "
                f"({len(latencies)} of {samples} samples taken)"
            ) from None

    async with (
        pgq_driver(dsn, driver) as client_driver,
        pgq_driver(dsn, driver) as worker_driver,
    ):
        # The request goes out on its own connection, as it would from another process.
        client = Queries(client_driver)
        await client.install()
        qm = QueueManager(Queries(worker_driver))

        # accepts_context is explicit because PgQueuer's auto-detection resolves the
        # annotation in this module's globals, where Context is not imported.
        @qm.entrypoint(_SLEEPER, accepts_context=True)
        async def sleeper(job: Job, ctx: Context) -> None:
            started.set()
            with ctx.cancellation:
                # Stands in for long work; only a cancellation ends it early.
                await asyncio.sleep(time_limit)
            if ctx.cancellation.cancelled_caught:
                observed_at[int(job.id)] = time.perf_counter()
                observed.set()

        run_task = asyncio.ensure_future(qm.run())
        try:
            for _ in range(samples):
                started.clear()
                observed.clear()
                [job_id] = await client.enqueue(_SLEEPER, None)
                await wait_or_timeout(started, "the job did not start")
                # Let the worker go idle, so a sample measures the signal, not start-up.
                await asyncio.sleep(settle)
                requested = time.perf_counter()
                await client.mark_job_as_cancelled([job_id])
                await wait_or_timeout(observed, "a cancellation was not observed")
                latencies.append(observed_at[int(job_id)] - requested)
        finally:
            # Release any job still waiting, or run() would wait for it on shutdown.
            for ctx in list(qm.job_context.values()):
                ctx.cancellation.cancel()
            qm.shutdown.set()
            await _run_bounded(
                run_task,
                time_limit=_STOP_GRACE,
                what="PgQueuer QueueManager shutdown",
                progress=lambda: f"{len(latencies)} samples taken",
            )
    return latencies


@contextlib.contextmanager
def _without_main_module_warning() -> Iterator[None]:
    """Drop Procrastinate's warning that an App is defined in ``__main__``.

    It warns because a separate worker process could not import such an app; this
    benchmark runs its worker in-process, so the warning (seen when this file is run as a
    script) is noise.
    """
    logger = logging.getLogger("procrastinate.blueprints")

    def not_main_module(record: logging.LogRecord) -> bool:
        return getattr(record, "action", None) != "app_defined_in___main__"

    logger.addFilter(not_main_module)
    try:
        yield
    finally:
        logger.removeFilter(not_main_module)


#: Procrastinate's finished jobs.
PROCRASTINATE_FINISHED = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"


def procrastinate_app(dsn: str, concurrency: int = PROCRASTINATE_CONCURRENCY) -> procrastinate.App:
    """A Procrastinate App on ``dsn`` whose pool has a connection for every job slot."""
    import procrastinate

    # Enough pooled connections that no job slot waits for one; the listener takes its own.
    pool_size = concurrency + 2
    with _without_main_module_warning():
        return procrastinate.App(
            connector=procrastinate.PsycopgConnector(
                conninfo=dsn, min_size=pool_size, max_size=pool_size
            )
        )


async def enqueue_procrastinate(dsn: str, n: int) -> None:
    """Apply Procrastinate's schema to ``dsn`` (a fresh, empty database) and defer ``n``
    no-op jobs in bulk (``batch_defer_async``)."""
    _check_count("n", n)
    app = procrastinate_app(dsn, 1)

    @app.task(name=NOOP)
    async def noop() -> None:
        """Runs in the consumer process only."""

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for size in _chunks(n):
            await noop.batch_defer_async(*({} for _ in range(size)))


async def check_procrastinate(dsn: str, n: int, ran: int) -> None:
    """Raise ``PeerCheckError`` unless exactly ``n`` jobs exist, all ``succeeded``, and the
    consumer ran the handler ``n`` times."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FROM procrastinate_jobs"
        )
        row = await cur.fetchone()
    ok, total = row if row is not None else (0, 0)
    if ran != n or ok != n or total != n:
        raise PeerCheckError(
            f"Procrastinate: {ran} jobs ran, {ok} of {total} succeeded; expected {n} of {n}"
        )


#: ``PRAGMA synchronous`` reads back as a number.
_SYNCHRONOUS_CODES = {"off": 0, "normal": 1, "full": 2, "extra": 3}


def _sync_huey_class(synchronous: str | None) -> Any:
    """``SqliteHuey`` whose connections run at ``PRAGMA synchronous=<synchronous>``.

    huey's ``SqliteStorage`` sets the pragma only through ``fsync`` (True: FULL, False:
    OFF, None: SQLite's compiled-in default), so a subclass sets it after huey's own
    connection setup. ``None`` keeps huey exactly as shipped.
    """
    from huey import SqliteHuey  # type: ignore[import-untyped]
    from huey.storage import SqliteStorage  # type: ignore[import-untyped]

    if synchronous is None:
        return SqliteHuey

    class _SyncSqliteStorage(SqliteStorage):  # type: ignore[misc]
        def _create_connection(self) -> Any:
            conn = super()._create_connection()
            conn.execute(f"PRAGMA synchronous={synchronous}")
            return conn

    class _SyncSqliteHuey(SqliteHuey):  # type: ignore[misc]
        storage_class = _SyncSqliteStorage

    return _SyncSqliteHuey


HUEY_NAME = "tether-bench"


def huey_instance(path: str, synchronous: str | None) -> Any:
    """A ``SqliteHuey`` on ``path`` at ``PRAGMA synchronous=<synchronous>`` (checked)."""
    huey = _sync_huey_class(synchronous)(name=HUEY_NAME, filename=path)
    if synchronous is not None:
        # Every huey connection is built the same way; check that the pragma held on one.
        level = int(huey.storage.conn.execute("PRAGMA synchronous").fetchone()[0])
        if level != _SYNCHRONOUS_CODES[synchronous.lower()]:
            huey.storage.close()
            raise PeerCheckError(f"Huey: PRAGMA synchronous is {level}, not {synchronous}")
    return huey


def huey_noop(huey: Any, ran: Callable[[], None] = lambda: None) -> Any:
    """Register the no-op task on ``huey``; it calls ``ran`` when it runs.

    huey names a task after the module its function is defined in, so the producer and
    the consumer process must both register it here.
    """

    @huey.task(name=NOOP)  # type: ignore[untyped-decorator]
    def noop() -> None:
        ran()

    return noop


#: Huey's tasks still queued (its queue table keeps a task only until a worker takes it).
HUEY_QUEUED = f"SELECT count(*) FROM task WHERE queue = '{HUEY_NAME}'"


def enqueue_huey(path: str, n: int, synchronous: str) -> None:
    """Enqueue ``n`` no-op tasks into a new SqliteHuey file at ``path``, one at a time.

    Any SQLite file (and its ``-wal``/``-shm`` files) already at ``path`` is removed
    first, so the queue holds exactly these.
    """
    _check_count("n", n)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)
    huey = huey_instance(path, synchronous)
    noop = huey_noop(huey)
    try:
        for _ in range(n):
            noop()
    finally:
        huey.storage.close()


def check_huey(path: str, n: int, ran: int, synchronous: str) -> None:
    """Raise ``PeerCheckError`` unless the queue is empty and the consumer ran ``n`` tasks."""
    huey = huey_instance(path, synchronous)
    try:
        left = huey.pending_count()
    finally:
        huey.storage.close()
    if ran != n or left:
        raise PeerCheckError(f"Huey: {ran} tasks ran, {left} left queued; expected {n}, 0")


@contextlib.contextmanager
def fresh_database(admin_dsn: str, prefix: str = "bench_peer") -> Iterator[str]:
    """Create a uniquely named empty database, yield its DSN, and drop it afterwards.

    ``admin_dsn`` is any database on the server that the user may connect to and that
    lets it run ``CREATE DATABASE``; the new database inherits its other parameters.
    """
    import psycopg
    from psycopg import sql

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    try:
        yield _with_dbname(admin_dsn, name)
    finally:
        # The server may be restarting (other people's fault tests restart it): keep
        # trying for a while rather than leave the database behind.
        deadline = time.monotonic() + DROP_PATIENCE
        while True:
            try:
                with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
                    # FORCE: a peer that failed mid-run may still hold a connection.
                    conn.execute(drop)
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)


def _with_dbname(dsn: str, dbname: str) -> str:
    """Return ``dsn`` pointing at ``dbname``, keeping its URL or key=value form.

    The URL form is kept because asyncpg cannot parse key=value strings.
    """
    if "://" in dsn:
        parts = urllib.parse.urlsplit(dsn)
        return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(dbname)))
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, dbname=dbname)


def _summary(latencies: list[float]) -> str:
    ms = sorted(x * 1000 for x in latencies)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return (
        f"n={len(ms)} median={statistics.median(ms):.2f} ms p95={p95:.2f} ms "
        f"min={ms[0]:.2f} ms max={ms[-1]:.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    """Measure PgQueuer's cancellation latency once and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--dsn",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="a database to connect to for CREATE/DROP DATABASE (default: %(default)s)",
    )
    parser.add_argument(
        "--samples", type=int, default=20, help="cancellation samples (default: 20)"
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    parser.add_argument(
        "--pgq-driver",
        choices=["asyncpg", "psycopg"],
        default=PGQ_DRIVER,
        help="PostgreSQL client for PgQueuer (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    with fresh_database(args.dsn, "bench_pgq_cancel") as dsn:
        lat = asyncio.run(
            cancel_latency_pgqueuer(
                dsn, args.samples, driver=args.pgq_driver, time_limit=args.timeout
            )
        )
    print(f"pgqueuer      cancel latency: {_summary(lat)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
