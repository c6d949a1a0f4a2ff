"""Peer job queues measured on this machine, so tether's figures sit beside theirs.

Each ``drain_*`` function builds its own state in the database (or file) it is handed,
enqueues ``n`` no-op jobs *untimed*, then times a single consumer draining them and
returns jobs per second. ``cancel_latency_pgqueuer`` times how long PgQueuer takes to
deliver a cancellation request to a running job.

Settings (``bench/run.py`` pairs them with tether's: defaults with defaults, tuned with
tuned, the tuned values found by its ``--sweep``):

* PgQueuer 1.6.0 - one in-process ``QueueManager`` on its own asyncpg connection (PgQueuer's
  preferred driver; ``driver="psycopg"`` is available but far slower, see ``_pgq_driver``),
  ``batch_size`` 10 by default (the library default, and what PgQueuer's own drain
  benchmark uses) or the tuned value, no concurrency cap (``max_concurrent_tasks=None``,
  the default), default durable (logged) tables. The clock runs from
  ``QueueManager.run()`` until it has returned, which includes the final flush of buffered
  "successful" status rows, so all ``n`` jobs are really gone from the queue table.
* Procrastinate 3.x - ``PsycopgConnector`` pool, one worker with ``concurrency=10`` async
  slots, ``wait=False`` (the worker exits by itself once the queue is empty and its jobs
  have finished), LISTEN/NOTIFY on, default ``delete_jobs="never"``.
* Huey - ``SqliteHuey`` (WAL journal, huey's default) with ``PRAGMA synchronous`` set to the
  level tether's SQLite store runs at in the same pairing (``normal`` or ``full``; huey's own
  ``fsync`` option knows only FULL and OFF, so ``_SyncSqliteStorage`` sets the pragma on
  each of its connections), enqueued one task at a time (huey has no bulk enqueue), drained
  by huey's own ``Consumer`` with 4 worker threads (or the tuned count), in this process.

Run by hand: ``python bench/peers.py --dsn postgresql://postgres@127.0.0.1:5432/test``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pgqueuer import Queries
    from pgqueuer.db import Driver

#: Which PostgreSQL client PgQueuer runs on; see ``_pgq_driver``.
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

_NOOP = "tether_bench_noop"
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
async def _pgq_driver(dsn: str, driver: PgqDriverName) -> AsyncIterator[Driver]:
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


async def _pgq_table_counts(queries: Queries) -> tuple[int, int]:
    """Return (rows left in PgQueuer's queue table, 'successful' rows in its log)."""
    settings = queries.qbe.settings
    left = await queries.driver.fetch(f"SELECT count(*) AS c FROM {settings.queue_table}")
    ok = await queries.driver.fetch(
        f"SELECT count(*) AS c FROM {settings.queue_table_log} WHERE status = 'successful'"
    )
    return int(str(left[0]["c"])), int(str(ok[0]["c"]))


async def drain_pgqueuer(
    dsn: str,
    n: int,
    *,
    batch_size: int = PGQ_BATCH_SIZE,
    driver: PgqDriverName = PGQ_DRIVER,
    time_limit: float = DEFAULT_TIMEOUT,
) -> float:
    """Drain ``n`` no-op PgQueuer jobs with one in-process QueueManager; return jobs/s.

    ``dsn`` must name a fresh, empty database: PgQueuer's schema is installed into it.
    The jobs are bulk-enqueued before the clock starts. The clock covers
    ``QueueManager.run()`` from its call until it returns after the ``n``-th job, which
    includes its start-up checks and the final flush of the jobs' status rows.
    Raises ``PeerTimeoutError`` after ``time_limit`` seconds and ``PeerCheckError`` if the
    queue is not empty afterwards.
    """
    from pgqueuer import Queries, QueueManager
    from pgqueuer.models import Job

    _check_count("n", n)
    _check_count("batch_size", batch_size)
    async with (
        _pgq_driver(dsn, driver) as setup_driver,
        _pgq_driver(dsn, driver) as worker_driver,
    ):
        setup = Queries(setup_driver)
        await setup.install()
        for size in _chunks(n):
            await setup.enqueue([_NOOP] * size, [None] * size, [0] * size)

        # The worker gets its own connection, as PgQueuer advises: it also LISTENs on it.
        qm = QueueManager(Queries(worker_driver))
        done = 0

        @qm.entrypoint(_NOOP, accepts_context=False)
        async def noop(job: Job) -> None:
            nonlocal done
            done += 1
            if done >= n:
                # run() then stops fetching, waits for in-flight jobs, flushes, returns.
                qm.shutdown.set()

        start = time.perf_counter()
        await _run_bounded(
            qm.run(batch_size=batch_size),
            time_limit=time_limit,
            what=f"PgQueuer drain of {n} jobs",
            progress=lambda: f"{done} jobs ran",
            stop=qm.shutdown.set,
        )
        elapsed = time.perf_counter() - start

        left, successful = await _pgq_table_counts(setup)
    if done != n or left != 0 or successful != n:
        raise PeerCheckError(
            f"PgQueuer: {done} jobs ran, {left} rows left in the queue, "
            f"{successful} logged successful; expected {n}, 0, {n}"
        )
    return n / elapsed


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
        _pgq_driver(dsn, driver) as client_driver,
        _pgq_driver(dsn, driver) as worker_driver,
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


async def drain_procrastinate(
    dsn: str,
    n: int,
    *,
    concurrency: int = PROCRASTINATE_CONCURRENCY,
    time_limit: float = DEFAULT_TIMEOUT,
) -> float:
    """Drain ``n`` no-op Procrastinate jobs with one worker; return jobs/s.

    ``dsn`` must name a fresh, empty database: Procrastinate's schema is applied to it.
    The jobs are deferred with ``batch_defer_async`` before the clock starts. The clock
    covers ``run_worker_async(wait=False)`` from its call until it returns, i.e. until the
    queue is empty and every job has finished and been marked. Raises
    ``PeerTimeoutError`` after ``time_limit`` seconds and ``PeerCheckError`` unless exactly
    ``n`` jobs succeeded.
    """
    import procrastinate

    _check_count("n", n)
    _check_count("concurrency", concurrency)
    # Enough pooled connections that no job slot waits for one; the listener takes its own.
    pool_size = concurrency + 2
    with _without_main_module_warning():
        app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(
                conninfo=dsn, min_size=pool_size, max_size=pool_size
            )
        )
    done = 0

    @app.task(name=_NOOP)
    async def noop() -> None:
        nonlocal done
        done += 1

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for size in _chunks(n):
            await noop.batch_defer_async(*({} for _ in range(size)))

        start = time.perf_counter()
        await _run_bounded(
            app.run_worker_async(
                wait=False,
                concurrency=concurrency,
                install_signal_handlers=False,
                listen_notify=True,
                # Bounds how long a cancelled (timed-out) worker waits for its jobs.
                shutdown_graceful_timeout=_STOP_GRACE,
            ),
            time_limit=time_limit,
            what=f"Procrastinate drain of {n} jobs",
            progress=lambda: f"{done} jobs ran",
        )
        elapsed = time.perf_counter() - start

        row: Any = await app.connector.execute_query_one_async(
            "SELECT count(*) FILTER (WHERE status = 'succeeded') AS ok, count(*) AS total"
            " FROM procrastinate_jobs"
        )
    if done != n or row["ok"] != n or row["total"] != n:
        raise PeerCheckError(
            f"Procrastinate: {done} jobs ran, {row['ok']} of {row['total']} succeeded; "
            f"expected {n} of {n}"
        )
    return n / elapsed


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


def drain_huey(
    path: str,
    n: int,
    *,
    workers: int = HUEY_WORKERS,
    synchronous: str | None = None,
    time_limit: float = DEFAULT_TIMEOUT,
) -> float:
    """Drain ``n`` no-op Huey tasks from a SqliteHuey file with huey's consumer; return jobs/s.

    ``synchronous`` (``"normal"``, ``"full"``) sets SQLite's ``synchronous`` pragma on every
    huey connection; ``None`` leaves huey's default (SQLite's compiled-in one).

    Any SQLite file (and its ``-wal``/``-shm`` files) already at ``path`` is removed first,
    so the queue starts empty; the file is left for the caller afterwards. Tasks are
    enqueued before the clock starts. huey's own ``Consumer`` (thread workers) runs in this
    process; the clock runs from its start until the ``n``-th task has completed, then the
    consumer is stopped and its threads joined. Raises ``PeerTimeoutError`` after
    ``time_limit`` seconds and ``PeerCheckError`` if any task failed or tasks remain queued.
    """
    # huey ships no type information.
    from huey.consumer import Consumer  # type: ignore[import-untyped]
    from huey.signals import SIGNAL_COMPLETE, SIGNAL_ERROR  # type: ignore[import-untyped]

    _check_count("n", n)
    _check_count("workers", workers)

    class _InProcessConsumer(Consumer):  # type: ignore[misc]
        """huey's consumer without its signal handlers.

        The stock consumer takes over SIGINT/SIGTERM/SIGHUP for the whole process (and
        can only do so from the main thread); the benchmark process keeps its own.
        """

        def _set_signal_handlers(self) -> None:
            pass

    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)

    huey = _sync_huey_class(synchronous)(name="tether-bench", filename=path)
    if synchronous is not None:
        # Every huey connection is built the same way; check that the pragma held on one.
        level = int(huey.storage.conn.execute("PRAGMA synchronous").fetchone()[0])
        if level != _SYNCHRONOUS_CODES[synchronous.lower()]:
            huey.storage.close()
            raise PeerCheckError(f"Huey: PRAGMA synchronous is {level}, not {synchronous}")
    lock = threading.Lock()
    completed = 0
    failed = 0
    all_done = threading.Event()

    @huey.task(name=_NOOP)  # type: ignore[untyped-decorator]
    def noop() -> None:
        return None

    @huey.signal(SIGNAL_COMPLETE, SIGNAL_ERROR)  # type: ignore[untyped-decorator]
    def on_finished(signal: str, task: object, *args: object) -> None:
        # Receivers run on the worker threads, hence the lock.
        nonlocal completed, failed
        with lock:
            if signal == SIGNAL_ERROR:
                failed += 1
            else:
                completed += 1
            if completed + failed >= n:
                all_done.set()

    try:
        for _ in range(n):
            noop()
        consumer = _InProcessConsumer(
            huey,
            workers=workers,
            worker_type="thread",
            periodic=False,
            check_worker_health=False,
            shutdown_timeout=_STOP_GRACE,
        )
        start = time.perf_counter()
        consumer.start()
        try:
            finished = all_done.wait(time_limit)
            elapsed = time.perf_counter() - start
        finally:
            # Graceful: each worker finishes its current task, then every thread is joined.
            consumer.stop(graceful=True)
        left = huey.pending_count()
    finally:
        huey.storage.close()
    if not finished:
        raise PeerTimeoutError(
            f"Huey drain of {n} tasks did not finish within {time_limit:g} s "
            f"({completed} completed)"
        )
    if failed or completed != n or left:
        raise PeerCheckError(
            f"Huey: {completed} completed, {failed} failed, {left} left queued; expected {n}"
        )
    return n / elapsed


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
    """Run every peer measurement once and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--dsn",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="a database to connect to for CREATE/DROP DATABASE (default: %(default)s)",
    )
    parser.add_argument("--n", type=int, default=2000, help="jobs per drain (default: 2000)")
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
    parser.add_argument(
        "--only",
        choices=["pgqueuer", "procrastinate", "huey", "cancel"],
        action="append",
        help="run only these measurements (repeatable)",
    )
    args = parser.parse_args(argv)
    wanted = set(args.only or ["pgqueuer", "procrastinate", "huey", "cancel"])

    if "pgqueuer" in wanted:
        with fresh_database(args.dsn, "bench_pgq") as dsn:
            rate = asyncio.run(
                drain_pgqueuer(dsn, args.n, driver=args.pgq_driver, time_limit=args.timeout)
            )
        print(f"pgqueuer      drain n={args.n}: {rate:10.1f} jobs/s", flush=True)
    if "procrastinate" in wanted:
        with fresh_database(args.dsn, "bench_proc") as dsn:
            rate = asyncio.run(drain_procrastinate(dsn, args.n, time_limit=args.timeout))
        print(f"procrastinate drain n={args.n}: {rate:10.1f} jobs/s", flush=True)
    if "huey" in wanted:
        with tempfile.TemporaryDirectory(prefix="bench_huey_") as tmp:
            rate = drain_huey(os.path.join(tmp, "huey.db"), args.n, time_limit=args.timeout)
        print(f"huey          drain n={args.n}: {rate:10.1f} jobs/s", flush=True)
    if "cancel" in wanted:
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
