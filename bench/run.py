"""tether's benchmark: tether on SQLite and PostgreSQL beside peer queues, in one run.

``make bench`` runs ``python bench/run.py --sweep``. It measures, prints a table with
ratios and a PASS/MISS summary against the targets, and writes ``bench/RESULTS.md``:

1. **Drain rate** of no-op jobs, jobs/s: tether on PostgreSQL and on SQLite, PgQueuer 1.6
   (PostgreSQL), Procrastinate 3.x (PostgreSQL) and Huey (SQLite), every one on the same
   number of jobs. Jobs are enqueued in bulk first, untimed; then the system's consumer
   drains them in a process of its own, as a user deploys it (``bench/consumers.py``), and
   the drain ends when the system's database shows every job finished (``bench/drain.py``);
   the machine's fsync latency is measured beside it (``bench/fsync.py``). Each system
   first runs an untimed warm-up drain; then each drain runs
   ``--repeat`` times, in rounds that interleave every system (rotating the order), and
   the median counts. Only equal settings are paired: tether's and PgQueuer's defaults;
   each one's tuned setting (``--sweep`` finds the best of a small grid, else a preset);
   tether and Huey on SQLite at the same ``synchronous`` level, ``normal`` and ``full``.
   Also: the drain beside a million finished jobs against an empty table's, with the
   claim latency of a single job in both; and 1, 2, 4, 8 worker processes draining
   together on PostgreSQL (``bench/bigtable.py`` loads the finished jobs).
2. **Cancellation latency** of a running async job waiting on ``ctx.cancelled``: from just
   before ``app.cancel(id, wait=0)`` until the handler sees the signal. In-process (worker
   and caller share a process, as in PgQueuer's figure) and cross-process (the worker is a
   subprocess; on SQLite only the heartbeat can then deliver the request).
3. **Recovery time** after ``kill -9`` of a worker process holding a running job: until
   the job runs again on a second, in-process worker.
4. **Memory**: resident set size of one worker process running 1,000 sleeping async jobs.
5. **Cancellation per executor** (``bench/cancel_executors.py``): async, thread and process
   handlers that stop cooperatively, on both stores: from just before the cancel request
   until the handler sees it, and until ``app.cancellations.wait()`` returns.
6. **Workflow cascades** (``bench/graphs.py``), on both stores: how long
   ``app.cancel(root)`` takes on a graph of 10,000 dependent jobs, and how long releasing
   1,000 blocked dependents takes when their dependency succeeds.

Run ``python bench/run.py --quick`` for a fast check (it writes no RESULTS.md unless
``--output`` is given); ``--help`` lists the options.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import logging
import math
import os
import platform
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import bigtable
import cancel_executors
import drain
import fsync
import graphs
import peers
import workerapp
from consumers import NO_PRUNING
from tether import App, JobContext, JobState, WorkerConfig
from tether.config import DEFAULT_QUEUE
from workerapp import MARKS, read_mark

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_PATH = BENCH_DIR / "RESULTS.md"
DEFAULT_ADMIN_DSN = os.environ.get("TETHER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

NOOP = "bench.noop"
#: tether's preset tuned drain setting (without ``--sweep``): enough slots that claiming,
#: not the slot count, sets the pace.
DRAIN_CONFIG = WorkerConfig(concurrency=200, claim_batch=50)
DEFAULT_CONFIG = WorkerConfig()
#: Jobs per ``enqueue_many`` call (one transaction each).
ENQUEUE_CHUNK = 5_000
#: A drain that makes no progress for this long has stalled (a broken worker, say).
STALL_SECONDS = 15.0
DRAIN_TIME_LIMIT = 300.0
#: Time given to any single awaited event (a job to start, a signal to arrive).
EVENT_TIMEOUT = 60.0
#: Pause between a job starting and its cancel request, so the worker is idle.
CANCEL_SETTLE = 0.05
MEMORY_CLAIM_BATCH = 100
MEMORY_SLEEP = 60.0
#: The memory benchmark's worker gets this long to stop gracefully on SIGTERM; its
#: sleeping jobs are then released back to ``queued``.
MEMORY_STOP_TIMEOUT = 2.0
#: ``app.cancel()``/``wait_cancelled()`` timeout in the per-executor cancel benchmark.
EXEC_CANCEL_TIMEOUT = 30.0
#: The release benchmark's timeout for the upstream job to run and finish.
RELEASE_TIMEOUT = 60.0
EXEC_CONFIG = cancel_executors.CONFIG

# The goals of issue 24 (Performance II), per pairing.
TARGET_PGQ_DEFAULTS_RATIO = 2.0
TARGET_PGQ_TUNED_RATIO = 1.5
TARGET_HUEY_NORMAL_RATIO = 2.0
TARGET_HUEY_FULL_RATIO = 2.5
TARGET_RECOVERY_MEDIAN = 5.0
TARGET_MEMORY_MB = 150.0


T = TypeVar("T")


class BenchError(RuntimeError):
    """A measurement could not be completed or its result is wrong."""


# -- plan and results ------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How much to measure."""

    #: Jobs per timed drain, the same for every system (Procrastinate included).
    jobs: int = 20_000
    repeat: int = 3
    #: Jobs in each system's untimed warm-up drain.
    warmup_jobs: int = 2_000
    #: Jobs per candidate drain in the ``--sweep`` for tuned settings, and its rounds.
    sweep_jobs: int = 5_000
    sweep_rounds: int = 2
    #: Finished jobs in the table for the million-row drain, and claim-latency samples.
    million_rows: int = 1_000_000
    latency_samples: int = 50
    #: Worker processes draining together in the scaling row.
    scale_processes: tuple[int, ...] = (1, 2, 4, 8)
    cancel_samples: int = 100
    xproc_samples: int = 20
    recovery_rounds: int = 10
    memory_jobs: int = 1_000
    #: Per-executor cancel samples per store (async and thread; process, which starts a
    #: process per job).
    exec_samples: int = 40
    exec_process_samples: int = 15
    #: The cascade graph: root -> ``cascade_children`` -> ``cascade_fanout`` each.
    cascade_children: int = 99
    cascade_fanout: int = 100
    cascade_rounds: int = 1
    release_dependents: int = 1_000
    release_rounds: int = 5

    @property
    def cascade_jobs(self) -> int:
        """Jobs in one cascade graph, the root included."""
        return 1 + self.cascade_children * (1 + self.cascade_fanout)

    @classmethod
    def quick(cls) -> Plan:
        """A plan that finishes in about a minute."""
        return cls(
            jobs=2_000,
            repeat=1,
            warmup_jobs=200,
            sweep_jobs=1_000,
            sweep_rounds=1,
            million_rows=100_000,
            latency_samples=10,
            cancel_samples=20,
            xproc_samples=5,
            recovery_rounds=3,
            memory_jobs=1_000,
            exec_samples=10,
            exec_process_samples=3,
            cascade_children=9,
            cascade_fanout=110,
            cascade_rounds=1,
            release_dependents=1_000,
            release_rounds=2,
        )


@dataclass
class Results:
    """Everything measured in one run; a missing key means not measured."""

    drains: dict[str, list[float]] = field(default_factory=dict)
    #: The 1-minute load average as each drain started, beside ``drains``.
    drain_load: dict[str, list[float]] = field(default_factory=dict)
    enqueue: dict[str, list[float]] = field(default_factory=dict)
    cancel: dict[str, list[float]] = field(default_factory=dict)
    #: How long the ``app.cancel(id, wait=0)`` call itself took, per cancel measurement.
    cancel_call: dict[str, list[float]] = field(default_factory=dict)
    recovery: dict[str, list[float]] = field(default_factory=dict)
    memory: dict[str, MemoryRun] = field(default_factory=dict)
    #: Per-executor cancellation, by :func:`exec_key` ("tether-pg async executor", ...).
    exec_cancel: dict[str, cancel_executors.ExecutorLatencies] = field(default_factory=dict)
    cascade: dict[str, list[graphs.CascadeRun]] = field(default_factory=dict)
    release: dict[str, list[graphs.ReleaseRun]] = field(default_factory=dict)
    #: ``--sweep`` runs: system -> (candidate, jobs/s), in the order run.
    sweep: dict[str, list[tuple[str, list[float]]]] = field(default_factory=dict)
    million: dict[str, MillionRun] = field(default_factory=dict)
    #: Scaling: worker processes -> jobs/s per round.
    scaling: dict[int, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    #: Things worth knowing about this run (retries), for the report.
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryRun:
    """One memory measurement of a worker process."""

    jobs: int
    idle_mb: float
    loaded_mb: float
    peak_mb: float
    ramp_s: float
    stop_s: float
    released: int
    exit_code: int | None


Row = tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table printed to the console and written to RESULTS.md."""

    title: str
    headers: tuple[str, ...]
    rows: list[Row]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100): a value that was measured."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _secs(seconds: float) -> str:
    return f"{seconds:.2f} s"


def _chunks(n: int, size: int) -> Iterator[int]:
    while n > 0:
        yield min(n, size)
        n -= min(n, size)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def wait_for_postgres(dsn: str, timeout: float) -> None:
    """Return once PostgreSQL accepts connections at ``dsn``, or after ``timeout`` seconds."""
    import psycopg

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(dsn, connect_timeout=3):
                return
        except psycopg.Error:
            time.sleep(1.0)


def attempt(results: Results, key: str, admin_dsn: str | None, fn: Callable[[], T]) -> T | None:
    """Run one measurement; if it fails, wait for PostgreSQL and try once more.

    The server is shared, and other people's fault tests restart it now and then: one
    retry keeps a restart from costing a figure, and the report notes it. A second
    failure is recorded in ``results.errors`` (one line) and gives ``None``.
    """
    try:
        return fn()
    except Exception as exc:
        message = _one_line(exc)
        print(f"  {key}: failed ({message}); retrying once", flush=True)
        results.notes.append(f"{key}: retried once after: {message}")
        if admin_dsn is not None:
            wait_for_postgres(admin_dsn, 60.0)
    try:
        return fn()
    except Exception as exc:
        results.errors[key] = _one_line(exc)
        print(f"  {key}: FAILED again: {results.errors[key]}", flush=True)
        return None


# -- drain -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _tether_count(url: str, sql: str) -> AsyncIterator[drain.Count]:
    """A count of tether's rows read by ``sql``, on a connection of the harness's own."""
    if url.startswith("sqlite:"):
        path = url.removeprefix("sqlite:///").split("?", 1)[0]
        async with drain.sqlite_count("/" + path.lstrip("/"), sql) as count:
            yield count
    else:
        async with drain.pg_count(url, sql) as count:
            yield count


async def _tether_rows(url: str, sql: str) -> int:
    async with _tether_count(url, sql) as count:
        return await count()


async def tether_drain(
    url: str, n: int, config: WorkerConfig, workdir: Path, *, keep_finished: bool = False
) -> tuple[float, float | None]:
    """Drain ``n`` no-op jobs with one worker process; return (jobs/s, enqueue jobs/s).

    The jobs are enqueued here with ``app.enqueue_many`` in chunks before the clock
    starts. The worker is ``bench/consumers.py tether`` in a process of its own; the clock
    runs from its release until ``n`` jobs enqueued here are ``succeeded`` in the database
    (``bench/drain.py``). Jobs already in the database (the million-row drain's finished
    ones) have lower ids and are not counted; afterwards, untimed, all ``n`` must be
    ``succeeded`` and the worker must have run the handler ``n`` times.
    """
    app = App(url, config=NO_PRUNING if keep_finished else None)

    @app.task(name=NOOP)
    async def noop(ctx: JobContext) -> None:
        """Runs in the worker process only."""

    try:
        await app.store()  # migrates a fresh database
        floor = await _tether_rows(url, "SELECT coalesce(max(id), 0) FROM tether_jobs")
        start = time.perf_counter()
        for size in _chunks(n, ENQUEUE_CHUNK):
            await app.enqueue_many([(noop, {})] * size)
        enqueue_rate = n / (time.perf_counter() - start)
    finally:
        await app.close()
    ours = f"FROM tether_jobs WHERE id > {floor}"
    command = ["tether", url, "--concurrency", str(config.slots(["async"]))]
    command += ["--claim-batch", str(config.claim_batch)]
    command += ["--keep-finished"] if keep_finished else []
    async with _tether_count(url, f"SELECT count(*) {ours} AND state = 'succeeded'") as count:
        got = await drain.drain([command], n, count, workdir, DRAIN_TIME_LIMIT)
    succeeded = await _tether_rows(url, f"SELECT count(*) {ours} AND state = 'succeeded'")
    total = await _tether_rows(url, f"SELECT count(*) {ours}")
    if got.ran != n or succeeded != n or total != n:
        raise BenchError(
            f"tether drain: {got.ran} handlers ran, {succeeded} of {total} jobs succeeded; "
            f"expected {n} of {n}"
        )
    return got.rate, enqueue_rate


#: A drain's runner: jobs in, (jobs/s, enqueue jobs/s or None for peers) out.
Runner = Callable[[int], tuple[float, float | None]]


@dataclass(frozen=True)
class Drainer:
    """One system's drain, runnable once per round (every system drains ``plan.jobs``)."""

    label: str
    run: Runner
    setting: str


@dataclass(frozen=True)
class PgqSetting:
    """PgQueuer's drain setting: ``batch_size`` and how many ``QueueManager`` processes."""

    batch: int
    consumers: int = 1

    def __str__(self) -> str:
        many = "es" if self.consumers > 1 else ""
        return f"batch_size={self.batch}, {self.consumers} consumer process{many}"


@dataclass(frozen=True)
class Tuned:
    """Each system's tuned setting: a preset, or the best of a ``--sweep``."""

    tether_pg: WorkerConfig
    pgq: PgqSetting
    tether_sqlite: WorkerConfig
    huey_workers: int
    swept: bool


PRESET_TUNED = Tuned(DRAIN_CONFIG, PgqSetting(50), DRAIN_CONFIG, peers.HUEY_WORKERS, swept=False)
PGQ_DEFAULTS = PgqSetting(peers.PGQ_BATCH_SIZE)
#: The ``--sweep`` grids: tether's concurrency x claim_batch, PgQueuer's batch_size x
#: consumer processes, huey's worker threads.
SWEEP_TETHER = tuple(
    WorkerConfig(concurrency=c, claim_batch=b) for c in (50, 100, 200) for b in (25, 50, 100)
)
SWEEP_PGQ = tuple(PgqSetting(b, k) for b in (10, 50, 100) for k in (1, 4))
SWEEP_HUEY = (2, 4, 8)
#: SQLite's ``synchronous`` levels both SQLite systems run at, pairwise.
SYNC_LEVELS = ("normal", "full")


def _cfg(config: WorkerConfig) -> str:
    # Unset, concurrency depends on the tasks: the bench's no-op task is async.
    slots = config.slots(["async"])
    return f"concurrency={slots}, claim_batch={config.claim_batch}"


def _tether_pg(admin_dsn: str, config: WorkerConfig) -> Runner:
    def run(n: int) -> tuple[float, float | None]:
        with tether_database(admin_dsn, "tether-pg", "bench_tether") as (url, tmp):
            return asyncio.run(tether_drain(url, n, config, tmp))

    return run


def _tether_sqlite(config: WorkerConfig, synchronous: str) -> Runner:
    def run(n: int) -> tuple[float, float | None]:
        with tempfile.TemporaryDirectory(prefix="bench_tether_") as tmp:
            url = f"sqlite:///{tmp}/tether.db?synchronous={synchronous}"
            return asyncio.run(tether_drain(url, n, config, Path(tmp)))

    return run


def _peer_drain(
    commands: list[list[str]],
    n: int,
    counter: contextlib.AbstractAsyncContextManager[drain.Count],
    workdir: Path,
    time_limit: float = DRAIN_TIME_LIMIT,
) -> drain.Drained:
    async def run() -> drain.Drained:
        async with counter as count:
            return await drain.drain(commands, n, count, workdir, time_limit)

    return asyncio.run(run())


def pgqueuer_drain(dsn: str, n: int, setting: PgqSetting, workdir: Path) -> float:
    """Enqueue ``n`` PgQueuer jobs into ``dsn`` (a fresh database), drain them with
    ``setting.consumers`` QueueManager processes, check the end state; jobs/s."""
    asyncio.run(peers.enqueue_pgqueuer(dsn, n))
    command = ["pgqueuer", dsn, "--batch-size", str(setting.batch)]
    got = _peer_drain(
        [command] * setting.consumers, n, drain.pg_count(dsn, peers.PGQ_FINISHED), workdir
    )
    asyncio.run(peers.check_pgqueuer(dsn, n, got.ran))
    return got.rate


def _pgqueuer(admin_dsn: str, setting: PgqSetting) -> Runner:
    def run(n: int) -> tuple[float, float | None]:
        with (
            peers.fresh_database(admin_dsn, "bench_pgq") as dsn,
            tempfile.TemporaryDirectory(prefix="bench_pgq_") as tmp,
        ):
            return pgqueuer_drain(dsn, n, setting, Path(tmp)), None

    return run


def _procrastinate(admin_dsn: str) -> Runner:
    def run(n: int) -> tuple[float, float | None]:
        with (
            peers.fresh_database(admin_dsn, "bench_proc") as dsn,
            tempfile.TemporaryDirectory(prefix="bench_proc_") as tmp,
        ):
            asyncio.run(peers.enqueue_procrastinate(dsn, n))
            command = ["procrastinate", dsn, "--concurrency", str(peers.PROCRASTINATE_CONCURRENCY)]
            # An order of magnitude slower than the others: give it ten times as long.
            got = _peer_drain(
                [command],
                n,
                drain.pg_count(dsn, peers.PROCRASTINATE_FINISHED),
                Path(tmp),
                10 * DRAIN_TIME_LIMIT,
            )
            asyncio.run(peers.check_procrastinate(dsn, n, got.ran))
            return got.rate, None

    return run


def _huey(workers: int, synchronous: str) -> Runner:
    def run(n: int) -> tuple[float, float | None]:
        with tempfile.TemporaryDirectory(prefix="bench_huey_") as tmp:
            path = os.path.join(tmp, "huey.db")
            peers.enqueue_huey(path, n, synchronous)
            command = ["huey", path, "--workers", str(workers), "--synchronous", synchronous]
            got = _peer_drain(
                [command], n, drain.sqlite_count(path, peers.HUEY_QUEUED, of=n), Path(tmp)
            )
            peers.check_huey(path, n, got.ran, synchronous)
            return got.rate, None

    return run


def _drainers(admin_dsn: str | None, tuned: Tuned, procrastinate: bool = True) -> list[Drainer]:
    how = "chosen by --sweep" if tuned.swept else "preset; --sweep chooses"
    out: list[Drainer] = []
    if admin_dsn is not None:
        out += [
            Drainer(
                "tether-pg defaults",
                _tether_pg(admin_dsn, DEFAULT_CONFIG),
                f"WorkerConfig() ({_cfg(DEFAULT_CONFIG)}), 1 worker process",
            ),
            Drainer(
                "pgqueuer defaults",
                _pgqueuer(admin_dsn, PGQ_DEFAULTS),
                f"QueueManager.run() defaults (batch_size={peers.PGQ_BATCH_SIZE}, "
                f"max_concurrent_tasks=None), 1 consumer process, {peers.PGQ_DRIVER}",
            ),
            Drainer(
                "tether-pg tuned",
                _tether_pg(admin_dsn, tuned.tether_pg),
                f"{_cfg(tuned.tether_pg)}, 1 worker process ({how})",
            ),
            Drainer(
                "pgqueuer tuned",
                _pgqueuer(admin_dsn, tuned.pgq),
                f"{tuned.pgq}, {peers.PGQ_DRIVER} ({how})",
            ),
        ]
        if procrastinate:
            out.append(
                Drainer(
                    "procrastinate",
                    _procrastinate(admin_dsn),
                    f"concurrency={peers.PROCRASTINATE_CONCURRENCY}, 1 worker process",
                )
            )
    for sync in SYNC_LEVELS:
        out += [
            Drainer(
                f"tether-sqlite {sync}",
                _tether_sqlite(tuned.tether_sqlite, sync),
                f"{_cfg(tuned.tether_sqlite)}, synchronous={sync}, 1 worker process ({how})",
            ),
            Drainer(
                f"huey {sync}",
                _huey(tuned.huey_workers, sync),
                f"SqliteHuey, {tuned.huey_workers} threads, synchronous={sync}, "
                f"1 consumer process ({how})",
            ),
        ]
    return out


def _best(
    results: Results,
    admin_dsn: str | None,
    plan: Plan,
    system: str,
    candidates: Sequence[tuple[str, T, Runner]],
) -> T | None:
    """Drain ``plan.sweep_jobs`` with every candidate in each of ``plan.sweep_rounds``
    rounds (after an untimed warm-up; the order rotates by one each round); the value of
    the candidate with the highest median, or ``None`` if none ran."""
    attempt(
        results, f"sweep {system} warm-up", admin_dsn, partial(candidates[0][2], plan.warmup_jobs)
    )
    rates: dict[str, list[float]] = {}
    for rnd in range(plan.sweep_rounds):
        shift = rnd % len(candidates)
        for label, _, run in [*candidates[shift:], *candidates[:shift]]:
            key = f"sweep {system} {label}"
            if key in results.errors:
                continue
            got = attempt(results, key, admin_dsn, partial(run, plan.sweep_jobs))
            if got is None:
                continue
            rates.setdefault(label, []).append(got[0])
            print(f"  sweep {system:<14} {label:<32} {got[0]:9.0f} jobs/s", flush=True)
    ranked = [
        (statistics.median(rates[label]), value) for label, value, _ in candidates if label in rates
    ]
    results.sweep[system] = [(label, rates[label]) for label, _, _ in candidates if label in rates]
    return max(ranked, key=lambda r: r[0])[1] if ranked else None


def sweep(plan: Plan, admin_dsn: str | None, results: Results) -> Tuned:
    """Each system's best setting on ``plan.sweep_jobs`` jobs, one run per candidate.

    tether on SQLite and huey are swept at ``synchronous=normal``; the setting found is
    used at both levels.
    """
    pg, pgq = PRESET_TUNED.tether_pg, PRESET_TUNED.pgq
    if admin_dsn is not None:
        pg = (
            _best(
                results,
                admin_dsn,
                plan,
                "tether-pg",
                [(_cfg(c), c, _tether_pg(admin_dsn, c)) for c in SWEEP_TETHER],
            )
            or pg
        )
        pgq = (
            _best(
                results,
                admin_dsn,
                plan,
                "pgqueuer",
                [(str(p), p, _pgqueuer(admin_dsn, p)) for p in SWEEP_PGQ],
            )
            or pgq
        )
    lite = (
        _best(
            results,
            admin_dsn,
            plan,
            "tether-sqlite",
            [(_cfg(c), c, _tether_sqlite(c, "normal")) for c in SWEEP_TETHER],
        )
        or PRESET_TUNED.tether_sqlite
    )
    huey = (
        _best(
            results,
            admin_dsn,
            plan,
            "huey",
            [(f"{w} threads", w, _huey(w, "normal")) for w in SWEEP_HUEY],
        )
        or PRESET_TUNED.huey_workers
    )
    return Tuned(pg, pgq, lite, huey, swept=True)


def measure_drains(
    plan: Plan, admin_dsn: str | None, results: Results, tuned: Tuned, procrastinate: bool = True
) -> list[Drainer]:
    """An untimed warm-up drain of every system, then ``plan.repeat`` timed rounds that
    each run every system once, in an order that rotates by one each round."""
    drainers = _drainers(admin_dsn, tuned, procrastinate)
    for d in drainers:
        got = attempt(results, f"{d.label} warm-up", admin_dsn, partial(d.run, plan.warmup_jobs))
        if got is not None:
            print(f"  warm-up            {d.label:<22} {got[0]:9.0f} jobs/s (untimed)", flush=True)
    for rnd in range(plan.repeat):
        shift = rnd % len(drainers)
        for d in drainers[shift:] + drainers[:shift]:
            if d.label in results.errors:
                continue
            load = os.getloadavg()[0]
            got = attempt(results, d.label, admin_dsn, partial(d.run, plan.jobs))
            if got is None:
                continue
            rate, enq = got
            results.drains.setdefault(d.label, []).append(rate)
            results.drain_load.setdefault(d.label, []).append(load)
            if enq is not None:
                results.enqueue.setdefault(d.label, []).append(enq)
            print(
                f"  drain round {rnd + 1}/{plan.repeat}  {d.label:<22} {rate:9.0f} jobs/s"
                f"  (n={plan.jobs}, load {load:.2f})",
                flush=True,
            )
    return drainers


# -- a million finished rows -----------------------------------------------------------


@dataclass
class MillionRun:
    """One store's drains beside a table of ``rows`` finished jobs, and claim latencies."""

    rows: int
    load_s: float = 0.0
    empty: list[float] = field(default_factory=list)
    loaded: list[float] = field(default_factory=list)
    latency_empty: list[float] = field(default_factory=list)
    latency_loaded: list[float] = field(default_factory=list)


PROBE = "bench.probe"
#: Idle time before each claim-latency sample, so the worker is waiting, not busy.
LATENCY_GAP = 0.05


async def claim_latency(url: str, samples: int) -> list[float]:
    """Seconds from just before ``app.enqueue`` of one job until its handler starts.

    An idle in-process worker with the default ``WorkerConfig``; one job at a time,
    ``LATENCY_GAP`` apart. Pruning is off.
    """
    app = App(url, config=NO_PRUNING)
    started: dict[int, float] = {}
    ran = asyncio.Event()

    @app.task(name=PROBE)
    async def probe(ctx: JobContext) -> None:
        started[ctx.id] = time.perf_counter()
        ran.set()

    out: list[float] = []
    try:
        worker = app.worker(DEFAULT_CONFIG)
        await worker.start()
        try:
            for _ in range(samples):
                await asyncio.sleep(LATENCY_GAP)
                ran.clear()
                sent = time.perf_counter()
                job = await app.enqueue(probe)
                await asyncio.wait_for(ran.wait(), EVENT_TIMEOUT)
                out.append(started[job.id] - sent)
        finally:
            await asyncio.wait_for(worker.stop(), 60)
    finally:
        await app.close()
    return out


async def _migrate(url: str) -> None:
    app = App(url)
    try:
        await app.store()
    finally:
        await app.close()


def _million_store(
    plan: Plan, admin_dsn: str | None, store: str, config: WorkerConfig
) -> MillionRun:
    """Load ``plan.million_rows`` finished jobs into one database, then in each round drain
    ``plan.jobs`` there and in a fresh empty database (alternating which goes first)."""
    out = MillionRun(plan.million_rows)

    def drain_once(url: str, n: int) -> float:
        with tempfile.TemporaryDirectory(prefix="bench_million_") as tmp:
            return asyncio.run(tether_drain(url, n, config, Path(tmp), keep_finished=True))[0]

    with tether_database(admin_dsn, store, "bench_million") as (big, _):
        asyncio.run(_migrate(big))
        out.load_s = bigtable.load_finished(big, plan.million_rows)
        print(
            f"  {store}: loaded {plan.million_rows} finished jobs in {out.load_s:.1f} s", flush=True
        )
        drain_once(big, plan.warmup_jobs)  # warm-up, untimed
        out.latency_loaded = asyncio.run(claim_latency(big, plan.latency_samples))
        for rnd in range(plan.repeat):
            with tether_database(admin_dsn, store, "bench_empty") as (empty, _):
                if rnd == 0:
                    drain_once(empty, plan.warmup_jobs)
                    out.latency_empty = asyncio.run(claim_latency(empty, plan.latency_samples))
                if rnd % 2:
                    out.loaded.append(drain_once(big, plan.jobs))
                    out.empty.append(drain_once(empty, plan.jobs))
                else:
                    out.empty.append(drain_once(empty, plan.jobs))
                    out.loaded.append(drain_once(big, plan.jobs))
            print(
                f"  {store} round {rnd + 1}/{plan.repeat}: empty {out.empty[-1]:.0f} jobs/s, "
                f"{plan.million_rows} finished {out.loaded[-1]:.0f} jobs/s",
                flush=True,
            )
    return out


def measure_million(plan: Plan, admin_dsn: str | None, results: Results, tuned: Tuned) -> None:
    """The million-finished-rows drain and claim latency, per store."""
    for store in _stores(admin_dsn):
        config = tuned.tether_pg if store == "tether-pg" else tuned.tether_sqlite
        got = attempt(
            results,
            f"{store} million",
            admin_dsn,
            partial(_million_store, plan, admin_dsn, store, config),
        )
        if got is not None:
            results.million[store] = got


# -- scaling ---------------------------------------------------------------------------


async def scaling_drain(
    url: str, n: int, processes: int, config: WorkerConfig, workdir: Path
) -> float:
    """``n`` no-op jobs drained by ``processes`` worker processes together; jobs/s.

    The jobs wait on a paused queue while the processes start and register; the clock
    runs from ``app.queues.resume`` until ``app.jobs.stats()`` (polled every 20 ms) shows all
    ``n`` succeeded, so process start-up is not timed.
    """
    app = workerapp.make_app(url)
    try:
        await app.store()
        await app.queues.pause(DEFAULT_QUEUE)
        for size in _chunks(n, ENQUEUE_CHUNK):
            await app.enqueue_many([(workerapp.NOOP, {})] * size)
        extra = (
            "--concurrency",
            str(config.slots(["async"])),
            "--claim-batch",
            str(config.claim_batch),
        )
        async with contextlib.AsyncExitStack() as stack:
            procs = []
            for i in range(processes):
                pdir = workdir / f"worker{i}"
                procs.append(
                    (await stack.enter_async_context(worker_process(url, pdir, *extra)), pdir)
                )
            for proc, pdir in procs:
                await wait_registered(app, proc, pdir)
            start = time.perf_counter()
            await app.queues.resume(DEFAULT_QUEUE)
            last, last_change = -1, start
            while True:
                stats = await app.jobs.stats()
                now = time.perf_counter()
                if stats["succeeded"] >= n:
                    break
                if stats["succeeded"] != last:
                    last, last_change = stats["succeeded"], now
                elif now - last_change > STALL_SECONDS:
                    raise BenchError(f"scaling drain with {processes} processes stalled: {stats}")
                await asyncio.sleep(0.02)
            elapsed = now - start
        if stats["succeeded"] != n:
            raise BenchError(f"scaling drain: job states {stats}; expected {n} succeeded")
        return n / elapsed
    finally:
        await app.close()


def measure_scaling(plan: Plan, admin_dsn: str | None, results: Results, tuned: Tuned) -> None:
    """1, 2, 4 and 8 worker processes on PostgreSQL, in rounds of rotating order."""
    if admin_dsn is None:
        return
    counts = list(plan.scale_processes)

    def run(k: int, n: int) -> float:
        with tether_database(admin_dsn, "tether-pg", "bench_scale") as (url, tmp):
            return asyncio.run(scaling_drain(url, n, k, tuned.tether_pg, tmp))

    attempt(results, "scaling warm-up", admin_dsn, partial(run, 1, plan.warmup_jobs))
    for rnd in range(plan.repeat):
        shift = rnd % len(counts)
        for k in counts[shift:] + counts[:shift]:
            key = f"scaling {k} processes"
            if key in results.errors:
                continue
            rate = attempt(results, key, admin_dsn, partial(run, k, plan.jobs))
            if rate is None:
                continue
            results.scaling.setdefault(k, []).append(rate)
            print(
                f"  scaling round {rnd + 1}/{plan.repeat}  {k} processes {rate:9.0f} jobs/s",
                flush=True,
            )


# -- worker subprocesses ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def worker_process(
    url: str, workdir: Path, *extra: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run ``bench/workerapp.py`` as a worker process; stop it (SIGTERM, then SIGKILL)."""
    with _open_log(workdir) as logf:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(BENCH_DIR / "workerapp.py"),
            url,
            *extra,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=logf,
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _open_log(workdir: Path) -> BinaryIO:
    workdir.mkdir(parents=True, exist_ok=True)
    return (workdir / "worker.log").open("ab")


def _log_tail(workdir: Path, lines: int = 15) -> str:
    try:
        text = (workdir / "worker.log").read_text(errors="replace")
    except OSError:
        return "(no worker log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty worker log)"


async def _poll(
    probe: Callable[[], Awaitable[bool]], every: float, timeout: float, what: str
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await probe():
        if loop.time() > deadline:
            raise BenchError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(every)


async def wait_registered(app: App, proc: asyncio.subprocess.Process, workdir: Path) -> None:
    """Wait until the worker process ``proc`` is registered and active."""

    async def registered() -> bool:
        if proc.returncode is not None:
            raise BenchError(f"worker process exited ({proc.returncode}):\n{_log_tail(workdir)}")
        return any(w.pid == proc.pid and w.state == "active" for w in await app.admin.workers())

    await _poll(registered, 0.05, EVENT_TIMEOUT, "worker process registration")


def vm_kib(pid: int, field_name: str) -> int:
    """A ``Vm*`` field of ``/proc/PID/status``, in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise BenchError(f"no {field_name} in /proc/{pid}/status")


# -- cancellation ----------------------------------------------------------------------


@dataclass
class Latencies:
    """Cancellation samples: request-to-handler seconds, and how long each
    ``app.cancel(id, wait=0)`` call took (its share of the total; empty for peers)."""

    total: list[float] = field(default_factory=list)
    call: list[float] = field(default_factory=list)


async def _cancel_samples(
    app: App,
    samples: int,
    mark: Callable[[str, int], Awaitable[float]],
    phase: float,
) -> Latencies:
    """Take ``samples`` cancellation samples, one job at a time.

    A ``bench.wait_cancel`` job starts and waits on ``ctx.cancelled``; ``CANCEL_SETTLE``
    plus a random ``0..phase`` seconds later the clock starts just before
    ``app.cancel(id, wait=0)`` and stops at the handler's own ``perf_counter()`` reading
    when it sees the signal (``mark("observed", id)``). Each job must end ``cancelled``.
    """
    out = Latencies()
    for _ in range(samples):
        job = await app.enqueue(workerapp.WAIT_CANCEL)
        await mark("started", job.id)
        await asyncio.sleep(CANCEL_SETTLE + random.uniform(0, phase))
        requested = time.perf_counter()
        await app.cancel(job.id, wait=0)
        returned = time.perf_counter()
        observed = await mark("observed", job.id)
        out.total.append(observed - requested)
        out.call.append(returned - requested)
        final = await app.wait(job.id, EVENT_TIMEOUT)
        if final.state is not JobState.CANCELLED:
            raise BenchError(f"job {job.id} ended {final.state}, not cancelled")
    return out


async def cancel_inprocess(url: str, samples: int) -> Latencies:
    """Cancellation latency with the worker in this process (default WorkerConfig).

    Caller and worker share one App (one store): on SQLite the store's in-process hint
    wakes the heartbeat at once, on PostgreSQL the NOTIFY does.
    """
    MARKS.clear()
    app = workerapp.make_app(url)
    try:
        worker = app.worker(WorkerConfig())
        await worker.start()
        try:
            return await _cancel_samples(
                app, samples, lambda what, job_id: MARKS.wait(what, job_id, EVENT_TIMEOUT), 0.0
            )
        finally:
            await asyncio.wait_for(worker.stop(), 60)
    finally:
        await app.close()


async def cancel_crossprocess(url: str, samples: int, workdir: Path) -> Latencies:
    """Cancellation latency with the worker in a subprocess (default WorkerConfig).

    The handler writes its readings to mark files; both processes read the same
    ``CLOCK_MONOTONIC``. Requests are spread at random over one heartbeat interval, as
    on SQLite only the worker's heartbeat can deliver them and the worker's claim and
    heartbeat loops would otherwise fix the phase of every sample alike.
    """
    marks = workdir / "marks"
    app = workerapp.make_app(url)
    try:
        await app.store()  # migrate before the worker starts
        async with worker_process(url, workdir, "--marks", str(marks)) as proc:
            await wait_registered(app, proc, workdir)
            return await _cancel_samples(
                app,
                samples,
                lambda what, job_id: read_mark(marks, what, job_id, EVENT_TIMEOUT),
                DEFAULT_CONFIG.heartbeat_interval,
            )
    finally:
        await app.close()


def _run_into(
    results: Results,
    key: str,
    admin_dsn: str | None,
    fn: Callable[[], Latencies | list[float]],
) -> None:
    """Run one latency measurement, adding its samples to ``results.cancel[key]``."""
    if key in results.errors:
        return
    got = attempt(results, key, admin_dsn, fn)
    if got is None:
        return
    samples = got.total if isinstance(got, Latencies) else got
    results.cancel.setdefault(key, []).extend(samples)
    if isinstance(got, Latencies):
        results.cancel_call.setdefault(key, []).extend(got.call)
    print(
        f"  {key:<28} n={len(samples):<4} p50={_ms(statistics.median(samples))}"
        f"  p99={_ms(percentile(samples, 99))}  max={_ms(max(samples))}",
        flush=True,
    )


def measure_cancellation(plan: Plan, admin_dsn: str | None, results: Results) -> None:
    """In-process samples in ``plan.repeat`` interleaved blocks (tether-PG, PgQueuer,
    tether-SQLite), then the cross-process variants."""
    blocks = list(_chunks(plan.cancel_samples, math.ceil(plan.cancel_samples / plan.repeat)))

    def tether_pg(n: int) -> Latencies:
        assert admin_dsn is not None
        with peers.fresh_database(admin_dsn, "bench_tether_cancel") as url:
            return asyncio.run(cancel_inprocess(url, n))

    def pgqueuer(n: int) -> list[float]:
        assert admin_dsn is not None
        with peers.fresh_database(admin_dsn, "bench_pgq_cancel") as dsn:
            return asyncio.run(peers.cancel_latency_pgqueuer(dsn, n, settle=CANCEL_SETTLE))

    def tether_sqlite(n: int) -> Latencies:
        with tempfile.TemporaryDirectory(prefix="bench_tether_") as tmp:
            return asyncio.run(cancel_inprocess(f"sqlite:///{tmp}/tether.db", n))

    for n in blocks:
        if admin_dsn is not None:
            _run_into(results, "tether-pg in-process", admin_dsn, partial(tether_pg, n))
            _run_into(results, "pgqueuer in-process", admin_dsn, partial(pgqueuer, n))
        _run_into(results, "tether-sqlite in-process", admin_dsn, partial(tether_sqlite, n))

    def xproc_pg() -> Latencies:
        assert admin_dsn is not None
        with (
            peers.fresh_database(admin_dsn, "bench_tether_xcancel") as url,
            tempfile.TemporaryDirectory(prefix="bench_tether_") as tmp,
        ):
            return asyncio.run(cancel_crossprocess(url, plan.xproc_samples, Path(tmp)))

    def xproc_sqlite() -> Latencies:
        with tempfile.TemporaryDirectory(prefix="bench_tether_") as tmp:
            url = f"sqlite:///{tmp}/tether.db"
            return asyncio.run(cancel_crossprocess(url, plan.xproc_samples, Path(tmp)))

    if admin_dsn is not None:
        _run_into(results, "tether-pg cross-process", admin_dsn, xproc_pg)
    _run_into(results, "tether-sqlite cross-process", admin_dsn, xproc_sqlite)


# -- recovery --------------------------------------------------------------------------


async def recovery(url: str, rounds: int, workdir: Path) -> list[float]:
    """Seconds from SIGKILL of a worker process until its job runs on another worker.

    Each round: a worker process (default WorkerConfig) takes a ``bench.hang`` job; once
    the job is ``running`` (polled with ``app.get``), a second worker starts in this
    process, and after a random 0.2-1.2 s (so the kill lands at a random point of the
    second worker's rescue cycle) the process is killed. The clock stops when attempt 2
    starts in the second worker's handler. The job must then succeed on attempt 2.
    """
    MARKS.clear()
    app = workerapp.make_app(url)
    times: list[float] = []
    try:
        await app.store()  # migrate before the worker starts
        for rnd in range(rounds):
            rdir = workdir / f"round{rnd}"
            async with worker_process(url, rdir) as proc:
                await wait_registered(app, proc, rdir)
                job = await app.enqueue(workerapp.HANG)

                async def running(job_id: int = job.id) -> bool:
                    j = await app.get(job_id)
                    return j.state is JobState.RUNNING and j.attempt == 1

                await _poll(running, 0.02, EVENT_TIMEOUT, f"job {job.id} running")
                second = app.worker(WorkerConfig())
                await second.start()
                try:
                    await asyncio.sleep(random.uniform(0.2, 1.2))
                    killed = time.perf_counter()
                    proc.kill()
                    await proc.wait()
                    restarted = await MARKS.wait("restarted", job.id, EVENT_TIMEOUT)
                    times.append(restarted - killed)
                    final = await app.wait(job.id, EVENT_TIMEOUT)
                    if final.state is not JobState.SUCCEEDED or final.attempt != 2:
                        raise BenchError(
                            f"job {job.id} ended {final.state} on attempt {final.attempt}, "
                            "expected succeeded on attempt 2"
                        )
                finally:
                    await asyncio.wait_for(second.stop(), 60)
    finally:
        await app.close()
    return times


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Show only errors of ``logger`` for a while."""
    target = logging.getLogger(logger)
    level = target.level
    target.setLevel(logging.ERROR)
    try:
        yield
    finally:
        target.setLevel(level)


def measure_recovery(plan: Plan, admin_dsn: str | None, results: Results) -> None:
    """Recovery rounds on SQLite, then on PostgreSQL."""

    def sqlite_rounds() -> list[float]:
        with tempfile.TemporaryDirectory(prefix="bench_tether_") as tmp:
            url = f"sqlite:///{tmp}/tether.db"
            return asyncio.run(recovery(url, plan.recovery_rounds, Path(tmp)))

    def pg_rounds() -> list[float]:
        assert admin_dsn is not None
        with (
            peers.fresh_database(admin_dsn, "bench_tether_recovery") as url,
            tempfile.TemporaryDirectory(prefix="bench_tether_") as tmp,
        ):
            return asyncio.run(recovery(url, plan.recovery_rounds, Path(tmp)))

    for key, fn in (("tether-sqlite", sqlite_rounds), ("tether-pg", pg_rounds)):
        if key == "tether-pg" and admin_dsn is None:
            continue
        with _quiet("tether.rescuer"):  # its warnings are the expected result here
            samples = attempt(results, f"recovery {key}", admin_dsn, fn)
        if samples is None:
            continue
        results.recovery[key] = samples
        print(
            f"  recovery {key:<14} n={len(samples)} median={_secs(statistics.median(samples))}"
            f"  p99={_secs(percentile(samples, 99))}  max={_secs(max(samples))}",
            flush=True,
        )


# -- memory ----------------------------------------------------------------------------


async def memory(url: str, jobs: int, workdir: Path) -> MemoryRun:
    """RSS of one worker process (concurrency=jobs, claim_batch=100) running ``jobs``
    sleeping async jobs; then SIGTERM, and the jobs must be released to ``queued``."""
    app = workerapp.make_app(url)
    try:
        await app.store()  # migrate before the worker starts
        extra = (
            f"--concurrency={jobs}",
            f"--claim-batch={MEMORY_CLAIM_BATCH}",
            f"--stop-timeout={MEMORY_STOP_TIMEOUT}",
        )
        async with worker_process(url, workdir, *extra) as proc:
            await wait_registered(app, proc, workdir)
            await asyncio.sleep(1.0)
            idle = vm_kib(proc.pid, "VmRSS")
            start = time.perf_counter()
            for size in _chunks(jobs, ENQUEUE_CHUNK):
                await app.enqueue_many([(workerapp.SLEEP, {"seconds": MEMORY_SLEEP})] * size)

            async def all_running() -> bool:
                if proc.returncode is not None:
                    raise BenchError(f"worker exited ({proc.returncode}):\n{_log_tail(workdir)}")
                return (await app.jobs.stats())["running"] >= jobs

            await _poll(all_running, 0.1, MEMORY_SLEEP / 2, f"{jobs} jobs running")
            ramp = time.perf_counter() - start
            await asyncio.sleep(0.5)
            loaded = vm_kib(proc.pid, "VmRSS")
            peak = vm_kib(proc.pid, "VmHWM")
            start = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 60)
            stop_s = time.perf_counter() - start
        stats = await app.jobs.stats()
    finally:
        await app.close()
    return MemoryRun(
        jobs,
        idle / 1024,
        loaded / 1024,
        peak / 1024,
        ramp,
        stop_s,
        stats["queued"],
        proc.returncode,
    )


def measure_memory(plan: Plan, admin_dsn: str | None, results: Results) -> None:
    """Memory on SQLite, then on PostgreSQL."""

    def sqlite_run() -> MemoryRun:
        with tempfile.TemporaryDirectory(prefix="bench_tether_") as tmp:
            url = f"sqlite:///{tmp}/tether.db"
            return asyncio.run(memory(url, plan.memory_jobs, Path(tmp)))

    def pg_run() -> MemoryRun:
        assert admin_dsn is not None
        with (
            peers.fresh_database(admin_dsn, "bench_tether_memory") as url,
            tempfile.TemporaryDirectory(prefix="bench_tether_") as tmp,
        ):
            return asyncio.run(memory(url, plan.memory_jobs, Path(tmp)))

    for key, fn in (("tether-sqlite", sqlite_run), ("tether-pg", pg_run)):
        if key == "tether-pg" and admin_dsn is None:
            continue
        run = attempt(results, f"memory {key}", admin_dsn, fn)
        if run is None:
            continue
        results.memory[key] = run
        print(
            f"  memory {key:<14} {run.jobs} jobs: RSS {run.loaded_mb:.1f} MB "
            f"(idle {run.idle_mb:.1f} MB, peak {run.peak_mb:.1f} MB); all running after "
            f"{_secs(run.ramp_s)}; SIGTERM->exit {_secs(run.stop_s)}, "
            f"{run.released} released to queued",
            flush=True,
        )


# -- cancellation per executor ---------------------------------------------------------

STORES = ("tether-pg", "tether-sqlite")


def _stores(admin_dsn: str | None) -> list[str]:
    return [s for s in STORES if s != "tether-pg" or admin_dsn is not None]


@contextlib.contextmanager
def tether_database(admin_dsn: str | None, store: str, prefix: str) -> Iterator[tuple[str, Path]]:
    """A fresh database for ``store`` (``tether-pg`` or ``tether-sqlite``): its URL, and
    a temporary directory that lives as long as it."""
    with tempfile.TemporaryDirectory(prefix="bench_tether_") as tmp:
        if store == "tether-pg":
            assert admin_dsn is not None
            with peers.fresh_database(admin_dsn, prefix) as url:
                yield url, Path(tmp)
        else:
            yield f"sqlite:///{tmp}/tether.db", Path(tmp)


def exec_key(store: str, executor: str) -> str:
    """The results key of one store's and executor's cancellation samples."""
    return f"{store} {executor} executor"


def _exec_block(
    admin_dsn: str | None, store: str, executor: str, n: int
) -> cancel_executors.ExecutorLatencies:
    with tether_database(admin_dsn, store, "bench_tether_xcancel") as (url, tmp):
        return asyncio.run(
            cancel_executors.measure(url, executor, n, tmp, CANCEL_SETTLE, EXEC_CANCEL_TIMEOUT)
        )


def measure_executor_cancellation(plan: Plan, admin_dsn: str | None, results: Results) -> None:
    """Per-executor samples in ``plan.repeat`` blocks; each block runs every store and
    executor once (a fresh database each), so the figures are taken interleaved."""
    sizes = {
        ex: plan.exec_process_samples if ex == "process" else plan.exec_samples
        for ex in cancel_executors.EXECUTORS
    }
    blocks = {ex: list(_chunks(n, math.ceil(n / plan.repeat))) for ex, n in sizes.items()}
    for b in range(max(len(v) for v in blocks.values())):
        for store in _stores(admin_dsn):
            for ex in cancel_executors.EXECUTORS:
                key = exec_key(store, ex)
                if b >= len(blocks[ex]) or key in results.errors:
                    continue
                got = attempt(
                    results,
                    key,
                    admin_dsn,
                    partial(_exec_block, admin_dsn, store, ex, blocks[ex][b]),
                )
                if got is None:
                    continue
                acc = results.exec_cancel.setdefault(key, cancel_executors.ExecutorLatencies())
                acc.observed += got.observed
                acc.settled += got.settled
                acc.call += got.call
                print(
                    f"  {store:<14} {ex:<8} n={len(got.observed):<3} handler "
                    f"p50={_ms(statistics.median(got.observed))} "
                    f"max={_ms(max(got.observed))}; wait_cancelled "
                    f"p50={_ms(statistics.median(got.settled))} max={_ms(max(got.settled))}",
                    flush=True,
                )


# -- workflow cascades -----------------------------------------------------------------


def _cascade_round(admin_dsn: str | None, store: str, plan: Plan) -> graphs.CascadeRun:
    with tether_database(admin_dsn, store, "bench_tether_cascade") as (url, _):
        return asyncio.run(graphs.cascade(url, plan.cascade_children, plan.cascade_fanout))


def _release_round(admin_dsn: str | None, store: str, plan: Plan) -> graphs.ReleaseRun:
    with tether_database(admin_dsn, store, "bench_tether_release") as (url, _):
        return asyncio.run(graphs.release(url, plan.release_dependents, RELEASE_TIMEOUT))


def measure_workflows(plan: Plan, admin_dsn: str | None, results: Results) -> None:
    """Cascade rounds, then release rounds; each round runs every store (a fresh
    database each), the order rotating by one each round."""
    stores = _stores(admin_dsn)
    for rnd in range(plan.cascade_rounds):
        shift = rnd % len(stores)
        for store in stores[shift:] + stores[:shift]:
            key = f"cascade {store}"
            if key in results.errors:
                continue
            run = attempt(results, key, admin_dsn, partial(_cascade_round, admin_dsn, store, plan))
            if run is None:
                continue
            results.cascade.setdefault(store, []).append(run)
            print(
                f"  cascade {store:<14} {run.jobs} jobs: app.cancel(root) {_secs(run.cancel_s)}"
                f" (store.request_cancel {_secs(run.transaction_s)}; enqueue, untimed: "
                f"{_secs(run.enqueue_s)}); {run.cancelled} cancelled",
                flush=True,
            )
    for rnd in range(plan.release_rounds):
        shift = rnd % len(stores)
        for store in stores[shift:] + stores[:shift]:
            key = f"release {store}"
            if key in results.errors:
                continue
            got = attempt(results, key, admin_dsn, partial(_release_round, admin_dsn, store, plan))
            if got is None:
                continue
            results.release.setdefault(store, []).append(got)
            print(
                f"  release {store:<14} {got.dependents} dependents: finish() "
                f"{_ms(got.finish_s)}, A returns -> released {_ms(got.end_to_end_s)} "
                f"(plain finish() {_ms(got.baseline_finish_s)}); {got.queued} queued",
                flush=True,
            )


# -- report ----------------------------------------------------------------------------


def machine_info(admin_dsn: str | None) -> dict[str, Any]:
    """Where and with what this run happened."""

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    postgres = "not reachable"
    if admin_dsn is not None:
        import psycopg

        with psycopg.connect(admin_dsn, connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            postgres = str(row[0]) if row else "unknown"
    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        rev = subprocess.run(
            ["git", "-C", str(BENCH_DIR), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(BENCH_DIR), "status", "--porcelain", "--", "../src"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        commit = f"{rev} (src/ has uncommitted changes)" if dirty else rev
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "os": platform.platform(),
        "python": platform.python_version(),
        "postgres": postgres,
        "sqlite": sqlite3.sqlite_version,
        "tether": f"{version('tether')}, commit {commit}",
        "peers": (
            f"pgqueuer {version('pgqueuer')}, asyncpg {version('asyncpg')}, "
            f"procrastinate {version('procrastinate')}, huey {version('huey')}"
        ),
        "load": "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()),
    }


def _ratio(a: str, b: str, results: Results) -> tuple[float | None, list[float]]:
    """Ratio of medians, and the per-round ratios (rounds ran interleaved)."""
    ra, rb = results.drains.get(a), results.drains.get(b)
    if not ra or not rb:
        return None, []
    per_round = [x / y for x, y in zip(ra, rb, strict=False)]
    return statistics.median(ra) / statistics.median(rb), per_round


def _status(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


#: (numerator, denominator, target) of the drain ratios reported; ``None``: no target.
#: Only equal pairings carry a target: defaults vs defaults, tuned vs tuned, and SQLite
#: at the same ``synchronous`` level.
RATIOS: tuple[tuple[str, str, float | None], ...] = (
    ("tether-pg defaults", "pgqueuer defaults", TARGET_PGQ_DEFAULTS_RATIO),
    ("tether-pg tuned", "pgqueuer tuned", TARGET_PGQ_TUNED_RATIO),
    ("tether-sqlite normal", "huey normal", TARGET_HUEY_NORMAL_RATIO),
    ("tether-sqlite full", "huey full", TARGET_HUEY_FULL_RATIO),
    ("tether-pg tuned", "procrastinate", None),
    ("tether-sqlite full", "tether-sqlite normal", None),
)
TARGET_MILLION_RATIO = 0.95
#: "Must not collapse": with more processes than cores, each may get less done, but
#: together they keep at least this share of one process's rate.
TARGET_SCALING_RATIO = 0.8


def _drain_tables(
    results: Results, drainers: list[Drainer], plan: Plan, summary: list[Row]
) -> list[Table]:
    rows: list[Row] = []
    for d in drainers:
        rates = results.drains.get(d.label)
        enq = results.enqueue.get(d.label)
        enq_s = f"{statistics.median(enq):.0f}" if enq else "-"
        if rates:
            median = f"{statistics.median(rates):.0f}"
            runs = ", ".join(f"{r:.0f}" for r in rates)
        else:
            median, runs = "ERROR", results.errors.get(d.label, "not run")
        took = f"{plan.jobs / statistics.median(rates):.1f} s" if rates else "-"
        load = ", ".join(f"{x:.1f}" for x in results.drain_load.get(d.label, [])) or "-"
        rows.append((d.label, median, runs, load, str(plan.jobs), took, enq_s, d.setting))
    settings = {d.label: d.setting for d in drainers}
    ratio_rows: list[Row] = []
    for a, b, target in RATIOS:
        if a not in settings or b not in settings:
            continue
        value, per_round = _ratio(a, b, results)
        shown = f"{value:.2f}x" if value is not None else "ERROR"
        rounds = ", ".join(f"{r:.2f}" for r in per_round) or "-"
        medians = tuple(
            f"{statistics.median(results.drains[x]):.0f}" if results.drains.get(x) else "-"
            for x in (a, b)
        )
        both = (settings[a], settings[b])
        if target is None:
            ratio_rows.append((f"{a} / {b}", *medians, shown, rounds, "-", "-", *both))
            if b == "procrastinate":
                summary.append((f"drain {a} / {b}", shown, "-", "n/a"))
            continue
        ok = value is not None and value >= target
        status = _status(ok)
        ratio_rows.append((f"{a} / {b}", *medians, shown, rounds, f">= {target:g}x", status, *both))
        summary.append((f"drain {a} / {b}", shown, f">= {target:g}x", status))
    return [
        Table(
            f"Drain rate (jobs/s, median of {plan.repeat} rounds after a warm-up; "
            f"{plan.jobs} jobs for every system; every consumer in a process of its own)",
            (
                "system",
                "median",
                "runs",
                "load (1 min) at each run",
                "jobs",
                "one drain",
                "enqueue jobs/s",
                "settings",
            ),
            rows,
        ),
        Table(
            "Drain ratios at equal settings (ratio of medians; per-round ratios alongside)",
            (
                "ratio",
                "tether jobs/s",
                "peer jobs/s",
                "value",
                "per round",
                "target",
                "status",
                "tether's settings",
                "peer's settings",
            ),
            ratio_rows,
        ),
    ]


def _sweep_table(results: Results, plan: Plan, tuned: Tuned | None) -> list[Table]:
    if not results.sweep or tuned is None:
        return []
    chosen = {
        "tether-pg": _cfg(tuned.tether_pg),
        "pgqueuer": str(tuned.pgq),
        "tether-sqlite": _cfg(tuned.tether_sqlite),
        "huey": f"{tuned.huey_workers} threads",
    }
    rows: list[Row] = [
        (
            system,
            label,
            f"{statistics.median(runs):.0f}",
            ", ".join(f"{r:.0f}" for r in runs),
            "chosen" if chosen.get(system) == label else "",
        )
        for system, candidates in results.sweep.items()
        for label, runs in candidates
    ]
    return [
        Table(
            f"Sweep for the tuned settings ({plan.sweep_jobs} jobs per drain, median of "
            f"{plan.sweep_rounds} rounds; SQLite at synchronous=normal)",
            ("system", "setting", "median", "runs", ""),
            rows,
        )
    ]


def _p50_p99(samples: list[float]) -> str:
    if not samples:
        return "-"
    return f"{_ms(statistics.median(samples))} / {_ms(percentile(samples, 99))}"


def _million_table(results: Results, plan: Plan, summary: list[Row]) -> list[Table]:
    keys = [s for s in STORES if s in results.million or f"{s} million" in results.errors]
    if not keys:
        return []
    rows: list[Row] = []
    for store in keys:
        run = results.million.get(store)
        if run is None or not run.empty or not run.loaded:
            rows.append(
                (store, "ERROR", results.errors.get(f"{store} million", "not run")) + ("",) * 5
            )
            continue
        ratio = statistics.median(run.loaded) / statistics.median(run.empty)
        per_round = ", ".join(f"{x / y:.2f}" for x, y in zip(run.loaded, run.empty, strict=False))
        ok = ratio >= TARGET_MILLION_RATIO
        rows.append(
            (
                store,
                f"{statistics.median(run.empty):.0f}",
                f"{statistics.median(run.loaded):.0f}",
                f"{ratio:.2f}x ({per_round})",
                _status(ok),
                _p50_p99(run.latency_empty),
                _p50_p99(run.latency_loaded),
                f"{run.load_s:.1f} s",
            )
        )
        summary.append(
            (
                f"drain with {run.rows} finished / empty, {store}",
                f"{ratio:.2f}x",
                f">= {TARGET_MILLION_RATIO:g}x",
                _status(ok),
            )
        )
    return [
        Table(
            f"Drain beside {plan.million_rows} finished jobs (jobs/s, median of {plan.repeat}; "
            f"claim latency p50 / p99 of {plan.latency_samples} single jobs)",
            (
                "store",
                "empty table",
                f"{plan.million_rows} finished",
                "ratio (per round)",
                f">= {TARGET_MILLION_RATIO:g}x",
                "claim latency, empty",
                f"claim latency, {plan.million_rows} finished",
                "load + ANALYZE",
            ),
            rows,
        )
    ]


def _scaling_table(results: Results, plan: Plan, summary: list[Row]) -> list[Table]:
    if not results.scaling and not any(k.startswith("scaling") for k in results.errors):
        return []
    base = results.scaling.get(1)
    rows: list[Row] = []
    for k in plan.scale_processes:
        rates = results.scaling.get(k)
        if not rates:
            rows.append(
                (str(k), "ERROR", results.errors.get(f"scaling {k} processes", "not run"), "", "")
            )
            continue
        if base:
            ratio = statistics.median(rates) / statistics.median(base)
            ratio_s = f"{ratio:.2f}x"
            per_round = ", ".join(f"{x / y:.2f}" for x, y in zip(rates, base, strict=False))
            if k > 1:
                summary.append(
                    (
                        f"scaling, {k} processes / 1",
                        ratio_s,
                        f"no collapse (>= {TARGET_SCALING_RATIO:g}x)",
                        _status(ratio >= TARGET_SCALING_RATIO),
                    )
                )
        else:
            ratio_s, per_round = "-", "-"
        rows.append(
            (
                str(k),
                f"{statistics.median(rates):.0f}",
                ", ".join(f"{r:.0f}" for r in rates),
                ratio_s,
                per_round,
            )
        )
    return [
        Table(
            f"Scaling on PostgreSQL: worker processes draining {plan.jobs} jobs together "
            f"(jobs/s, median of {plan.repeat})",
            ("processes", "median", "runs", "ratio to 1 process", "per round"),
            rows,
        )
    ]


def _cancel_table(results: Results, summary: list[Row]) -> list[Table]:
    keys = list(results.cancel)
    keys += [k for k in results.errors if k.endswith("process") and k not in keys]
    if not keys:
        return []
    rows: list[Row] = []
    for key in keys:
        s = results.cancel.get(key)
        call = results.cancel_call.get(key)
        call_p50 = _ms(statistics.median(call)) if call else "-"
        if s:
            p50, p99 = statistics.median(s), percentile(s, 99)
            rows.append((key, str(len(s)), _ms(p50), _ms(p99), _ms(max(s)), call_p50))
        else:
            rows.append((key, "0", "ERROR", results.errors.get(key, ""), "-", "-"))
    ours = results.cancel.get("tether-pg in-process")
    theirs = results.cancel.get("pgqueuer in-process")
    figure, target = "cancel p99 tether-pg vs pgqueuer (in-process)", "<= pgqueuer"
    if ours and theirs:
        p_ours, p_theirs = percentile(ours, 99), percentile(theirs, 99)
        value = f"{_ms(p_ours)} vs {_ms(p_theirs)}"
        summary.append((figure, value, target, _status(p_ours <= p_theirs)))
    elif "tether-pg in-process" in results.errors or "pgqueuer in-process" in results.errors:
        summary.append((figure, "ERROR", target, "MISS"))
    for key in (
        "tether-sqlite in-process",
        "tether-pg cross-process",
        "tether-sqlite cross-process",
    ):
        s = results.cancel.get(key)
        if s:
            summary.append((f"cancel p99 {key}", _ms(percentile(s, 99)), "-", "n/a"))
    return [
        Table(
            "Cancellation latency (request -> handler sees ctx.cancelled)",
            ("measurement", "samples", "p50", "p99", "max", "app.cancel() call p50"),
            rows,
        )
    ]


def _recovery_table(results: Results, summary: list[Row]) -> list[Table]:
    rows: list[Row] = []
    target = f"< {TARGET_RECOVERY_MEDIAN:g} s"
    for key in ("tether-sqlite", "tether-pg"):
        s = results.recovery.get(key)
        if s:
            med = statistics.median(s)
            rows.append((key, str(len(s)), _secs(med), _secs(percentile(s, 99)), _secs(max(s))))
            ok = med < TARGET_RECOVERY_MEDIAN
            summary.append((f"recovery median {key}", _secs(med), target, _status(ok)))
        elif f"recovery {key}" in results.errors:
            rows.append((key, "0", "ERROR", results.errors[f"recovery {key}"], "-"))
            summary.append((f"recovery median {key}", "ERROR", target, "MISS"))
    if not rows:
        return []
    return [
        Table(
            "Recovery after kill -9 (SIGKILL -> attempt 2 running on another worker)",
            ("store", "rounds", "median", "p99", "max"),
            rows,
        )
    ]


def _memory_table(results: Results, summary: list[Row]) -> list[Table]:
    rows: list[Row] = []
    target = f"< {TARGET_MEMORY_MB:g} MB"
    for key in ("tether-sqlite", "tether-pg"):
        m = results.memory.get(key)
        if m is not None:
            per_job = (m.loaded_mb - m.idle_mb) * 1024 / m.jobs
            stop = f"{_secs(m.stop_s)}, {m.released}/{m.jobs} released, exit {m.exit_code}"
            rows.append(
                (
                    key,
                    str(m.jobs),
                    f"{m.loaded_mb:.1f} MB",
                    f"{m.idle_mb:.1f} MB",
                    f"{m.peak_mb:.1f} MB",
                    f"{per_job:.0f} KB",
                    _secs(m.ramp_s),
                    stop,
                )
            )
            ok = m.loaded_mb < TARGET_MEMORY_MB and m.released == m.jobs
            figure = f"memory {key} ({m.jobs} jobs)"
            summary.append((figure, f"{m.loaded_mb:.1f} MB", target, _status(ok)))
        elif f"memory {key}" in results.errors:
            error = results.errors[f"memory {key}"]
            rows.append((key, "-", "ERROR", error, "-", "-", "-", "-"))
            summary.append((f"memory {key}", "ERROR", target, "MISS"))
    if not rows:
        return []
    headers = ("store", "jobs", "RSS loaded", "RSS idle", "peak (VmHWM)", "per job")
    return [
        Table(
            "Memory of one worker process with sleeping async jobs (VmRSS; MB = MiB)",
            (*headers, "all running after", "SIGTERM -> exit"),
            rows,
        )
    ]


def _exec_cancel_table(results: Results, summary: list[Row]) -> list[Table]:
    rows: list[Row] = []
    for store in STORES:
        for ex in cancel_executors.EXECUTORS:
            key = exec_key(store, ex)
            lat = results.exec_cancel.get(key)
            if lat is not None and lat.observed:
                seen, settled = lat.observed, lat.settled
                rows.append(
                    (
                        store,
                        ex,
                        str(len(seen)),
                        _ms(statistics.median(seen)),
                        _ms(percentile(seen, 99)),
                        _ms(statistics.median(settled)),
                        _ms(percentile(settled, 99)),
                        _ms(max(settled)),
                        _ms(statistics.median(lat.call)),
                    )
                )
                summary.append(
                    (
                        f"cancel p99 {store} {ex} executor (handler / wait_cancelled)",
                        f"{_ms(percentile(seen, 99))} / {_ms(percentile(settled, 99))}",
                        "-",
                        "n/a",
                    )
                )
            elif key in results.errors:
                rows.append((store, ex, "0", "ERROR", results.errors[key], "-", "-", "-", "-"))
    if not rows:
        return []
    return [
        Table(
            "Cancellation latency per executor (cooperative handlers; request -> handler saw "
            "it, and -> app.cancellations.wait() returned)",
            (
                "store",
                "executor",
                "samples",
                "handler p50",
                "handler p99",
                "wait_cancelled p50",
                "wait_cancelled p99",
                "wait_cancelled max",
                "app.cancel() returned p50",
            ),
            rows,
        )
    ]


def _workflow_tables(results: Results, plan: Plan, summary: list[Row]) -> list[Table]:
    tables: list[Table] = []
    rows: list[Row] = []
    for store in STORES:
        runs = results.cascade.get(store)
        if runs:
            times = [r.cancel_s for r in runs]
            med = statistics.median(times)
            rows.append(
                (
                    store,
                    str(runs[0].jobs),
                    str(len(runs)),
                    _secs(med),
                    ", ".join(_secs(t) for t in times),
                    _secs(statistics.median([r.transaction_s for r in runs])),
                    f"{min(r.cancelled for r in runs)}/{runs[0].jobs} cancelled, record "
                    + "/".join(sorted({r.status for r in runs})),
                    _secs(statistics.median([r.enqueue_s for r in runs])),
                )
            )
            summary.append(
                (f"cascade cancel {store} ({runs[0].jobs} jobs)", _secs(med), "-", "n/a")
            )
        elif f"cascade {store}" in results.errors:
            error = results.errors[f"cascade {store}"]
            rows.append((store, "-", "0", "ERROR", error, "-", "-", "-"))
    if rows:
        tables.append(
            Table(
                f"Cancel a workflow of {plan.cascade_jobs} jobs (root -> {plan.cascade_children}"
                f" -> {plan.cascade_fanout} each): app.cancel(root, wait={graphs.CASCADE_WAIT:g})",
                (
                    "store",
                    "jobs",
                    "rounds",
                    "median",
                    "runs",
                    "of which store.request_cancel",
                    "verified",
                    "enqueue (untimed)",
                ),
                rows,
            )
        )
    rows = []
    for store in STORES:
        rel = results.release.get(store)
        if rel:
            fin = [r.finish_s for r in rel]
            e2e = [r.end_to_end_s for r in rel]
            rows.append(
                (
                    store,
                    str(rel[0].dependents),
                    str(len(rel)),
                    _ms(statistics.median(fin)),
                    _ms(max(fin)),
                    _ms(statistics.median(e2e)),
                    _ms(max(e2e)),
                    _ms(statistics.median([r.baseline_finish_s for r in rel])),
                    f"{min(r.queued for r in rel)}/{rel[0].dependents} queued",
                )
            )
            summary.append(
                (
                    f"release {store} ({rel[0].dependents} dependents, A returns -> queued)",
                    _ms(statistics.median(e2e)),
                    "-",
                    "n/a",
                )
            )
        elif f"release {store}" in results.errors:
            error = results.errors[f"release {store}"]
            rows.append((store, "-", "0", "ERROR", error, "-", "-", "-", "-"))
    if rows:
        tables.append(
            Table(
                f"Release {plan.release_dependents} blocked dependents when their dependency "
                "succeeds",
                (
                    "store",
                    "dependents",
                    "rounds",
                    "finish() median",
                    "finish() max",
                    "A returns -> queued median",
                    "A returns -> queued max",
                    "plain finish() median",
                    "verified",
                ),
                rows,
            )
        )
    return tables


def build_tables(
    results: Results, drainers: list[Drainer], plan: Plan, tuned: Tuned | None = None
) -> list[Table]:
    """The report's tables, from the measurements; the summary comes last."""
    summary: list[Row] = []
    tables = _drain_tables(results, drainers, plan, summary) if drainers else []
    tables += _sweep_table(results, plan, tuned)
    tables += _million_table(results, plan, summary)
    tables += _scaling_table(results, plan, summary)
    tables += _cancel_table(results, summary)
    tables += _exec_cancel_table(results, summary)
    tables += _recovery_table(results, summary)
    tables += _memory_table(results, summary)
    tables += _workflow_tables(results, plan, summary)
    tables.append(Table("Summary", ("figure", "value", "target", "status"), summary))
    return tables


def render_console(tables: list[Table]) -> str:
    """Plain aligned text."""
    out: list[str] = []
    for t in tables:
        widths = [len(h) for h in t.headers]
        for row in t.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=False)]
        out.append(f"\n{t.title}")
        out.append("  ".join(h.ljust(w) for h, w in zip(t.headers, widths, strict=False)))
        out.append("  ".join("-" * w for w in widths))
        for row in t.rows:
            out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)))
    return "\n".join(out)


#: Sections of the report that other scripts write (``bench/indexcost.py`` and
#: ``bench/pgprofile.py``, ``bench/connections.py``): a new report keeps them as they were.
KEPT_SECTIONS = (
    "## Writes per job",
    "## Connections",
    "## Durable steps",
    "## Job logs",
    "## Hooks and tracing",
)


def kept_sections(path: Path) -> str:
    """The sections of ``path`` named in :data:`KEPT_SECTIONS`, to append to a new report."""
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8")
    kept = []
    for heading in KEPT_SECTIONS:
        start = text.find(f"\n{heading}\n")
        if start >= 0:
            end = text.find("\n## ", start + len(heading) + 1)
            kept.append(text[start : end if end >= 0 else len(text)].rstrip("\n") + "\n")
    return "".join(kept)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(
    tables: list[Table],
    info: dict[str, Any],
    plan: Plan,
    argv: list[str],
    elapsed: float,
    notes: list[str],
) -> str:
    """RESULTS.md."""
    lines = [
        "# tether benchmark results",
        "",
        "Generated by `bench/run.py` (`make bench`); do not edit by hand, run it again.",
        "The machine may be shared with other work (see the load average), so figures are",
        "noisy: drains are medians of rounds that interleave all systems, and every ratio",
        "compares runs made in the same rounds.",
        "",
        "| | |",
        "|---|---|",
    ]
    for key in ("date", "nproc", "cpu", "os", "python", "postgres", "sqlite", "tether", "peers"):
        lines.append(f"| {key} | {_md_cell(info[key])} |")
    for key, value in info.get("fsync", {}).items():
        lines.append(f"| {_md_cell(key)} | {_md_cell(value)} |")
    lines.append(f"| load average (start -> end) | {info['load']} -> {info['load_end']} |")
    lines.append(
        f"| command | `{_md_cell(' '.join(['bench/run.py', *argv]))}` ({elapsed / 60:.1f} min) |"
    )
    lines.append(
        f"| plan | {plan.jobs} jobs per drain for every system, after a {plan.warmup_jobs}-job "
        f"warm-up; {plan.repeat} round(s); sweep {plan.sweep_jobs} jobs x "
        f"{plan.sweep_rounds} round(s) per candidate; "
        f"{plan.million_rows} finished rows, {plan.latency_samples} claim-latency samples; "
        f"{'/'.join(map(str, plan.scale_processes))} worker processes; "
        f"{plan.cancel_samples} in-process and {plan.xproc_samples} "
        f"cross-process cancel samples; {plan.recovery_rounds} recovery rounds; "
        f"{plan.memory_jobs} jobs for memory; {plan.exec_samples} per-executor cancel samples "
        f"per store (process {plan.exec_process_samples}); a {plan.cascade_jobs}-job cascade "
        f"x {plan.cascade_rounds}; {plan.release_dependents} dependents released x "
        f"{plan.release_rounds} |"
    )
    for t in tables:
        lines += ["", f"## {t.title}", ""]
        lines.append("| " + " | ".join(t.headers) + " |")
        lines.append("|" + "---|" * len(t.headers))
        for row in t.rows:
            lines.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    if notes:
        lines += ["", "## Notes from this run", ""]
        lines += [f"- {_md_cell(n)}" for n in notes]
    lines += ["", "## How each figure is measured", "", METHOD.strip(), ""]
    return "\n".join(lines)


METHOD = f"""
- **Drain**: every system drains the same `n` no-op jobs (the plan line above), enqueued
  first and untimed by the harness (tether: `app.enqueue_many` in chunks of {ENQUEUE_CHUNK},
  one transaction each, the "enqueue jobs/s" column; PgQueuer and Procrastinate in bulk;
  Huey one task at a time). Before the timed rounds each system runs one untimed warm-up
  drain of fewer jobs. Every consumer then runs **in a process of its own**, as a user
  deploys it (`bench/consumers.py`: tether's `Worker.run(handle_signals=True)`, what
  `tether worker` runs; one PgQueuer `QueueManager` per process on its own asyncpg
  connection; one Procrastinate worker; huey's own `Consumer.run()` with thread
  workers), logging at WARNING. Each process imports, connects and says it is ready;
  the clock starts when the harness releases them all and stops when the system's
  **database** shows all `n` finished, read by the harness on its own connection
  (`bench/drain.py`): tether, `n` of the jobs enqueued `succeeded`; PgQueuer, `n`
  `successful` rows in `pgqueuer_log`; Procrastinate, `n` `succeeded`; Huey, whose
  no-op returns `None` and so stores no result, no task left in its queue table (a
  worker deletes a task as it takes it). The count is polled at a pace set by the
  drain's progress (half the expected rest, {drain.POLL_MIN * 1000:g} ms to
  {drain.POLL_MAX:g} s), some twenty queries a drain. The consumers are then stopped
  (SIGINT, each library's graceful stop) and say how often their handler ran: that
  must be `n`, and the database must show exactly `n` jobs finished and none left.
  PostgreSQL databases are fresh (`peers.fresh_database`); SQLite files are fresh in a
  temp dir. Procrastinate is an order of magnitude slower, so its drains take the
  longest (the "one drain" column). Every round runs every system once, the order
  rotating by one each round; the load column is the 1-minute load average as each run
  started. Ratios are ratios of medians; the per-round ratios pair runs that were close
  in time. The header's fsync rows (`bench/fsync.py`) say what a durable write costs
  on this machine, measured as the run starts.
- **Pairings**: only equal settings are compared against a target. *Defaults*: tether's
  `WorkerConfig()` (concurrency={DEFAULT_CONFIG.slots(["async"])} for async tasks,
  claim_batch={DEFAULT_CONFIG.claim_batch}) in one worker process against PgQueuer's
  `QueueManager.run()` defaults (`batch_size={peers.PGQ_BATCH_SIZE}`, no
  `max_concurrent_tasks` cap) in one process. *Tuned*: each system's best setting from
  `--sweep` (tether concurrency {{50, 100, 200}} x claim_batch {{25, 50, 100}}, one worker
  process; PgQueuer batch_size {{10, 50, 100}} x {{1, 4}} `QueueManager` processes, each
  on its own connection; Huey {{{", ".join(map(str, SWEEP_HUEY))}}} threads): the highest
  median of rounds that drain fewer jobs with every candidate, the order rotating (the
  sweep table); without `--sweep` a preset (tether {_cfg(PRESET_TUNED.tether_pg)},
  PgQueuer {PRESET_TUNED.pgq}, Huey {PRESET_TUNED.huey_workers} threads), as the settings
  column says. *SQLite*: tether (`sqlite:///...?synchronous=LEVEL`) and Huey
  (`PRAGMA synchronous=LEVEL` on each of its connections, see `bench/peers.py`) run at the
  same level, both `normal` and both `full`, both in WAL mode.
- **Million finished rows** (tether, each store): one database is loaded with
  finished (`succeeded`) jobs and their three event rows each by `bench/bigtable.py`, one
  set-based INSERT per table (`generate_series` on PostgreSQL, a recursive CTE on SQLite;
  the insert triggers are off for that one transaction), then `ANALYZE`. Pruning is off
  (every retention `None`). After an untimed warm-up drain, each round drains `n` jobs in
  it and in a fresh empty database (the order alternating), with the tuned tether
  setting, a worker process timed as in the drain (the count: jobs above the loaded
  ids, `succeeded`); the loaded database keeps the jobs of earlier rounds (`n` per round, small
  beside the million). *Claim latency*: an idle in-process worker (`WorkerConfig()`);
  one job at a time, {LATENCY_GAP * 1000:.0f} ms apart, from just before `app.enqueue()` until
  its handler's first `perf_counter()` reading.
- **Scaling** (PostgreSQL): `n` jobs are enqueued on a paused queue; 1, 2, 4 or 8
  `bench/workerapp.py` worker processes (the tuned tether setting each) start and
  register; the clock runs from `app.queues.resume()` until `app.jobs.stats()` (polled every
  20 ms) shows all `n` succeeded. A fresh database per run; rounds rotate the order. The
  figure is the ratio of medians to 1 process; the machine has the CPU count above, so
  beyond it processes share cores with each other and with PostgreSQL.
- **Cancellation**: one job at a time waits on `ctx.cancelled`; {CANCEL_SETTLE * 1000:.0f} ms
  after it started, the clock starts just before `app.cancel(id, wait=0)` (a request
  only) and stops at the handler's `time.perf_counter()` when it sees the signal; the job
  must then end `cancelled`. The last column is how long the `app.cancel()` call itself
  took (its share of the latency). Default `WorkerConfig` (heartbeat every
  {DEFAULT_CONFIG.heartbeat_interval:g} s). *In-process*: caller and worker share one
  process and one App; on PostgreSQL the request travels by NOTIFY to the store's LISTEN
  connection, which wakes the heartbeat; on SQLite the store's in-process hint wakes the
  heartbeat at once. *Cross-process*: the worker is `bench/workerapp.py` in a subprocess
  and writes its reading to a file (`perf_counter` is `CLOCK_MONOTONIC`, shared by all
  processes); on SQLite nothing but the periodic heartbeat can deliver the request there,
  so cross-process requests are sent at a random point of one heartbeat interval
  ({CANCEL_SETTLE * 1000:.0f} ms + 0-{DEFAULT_CONFIG.heartbeat_interval:g} s after the start).
  PgQueuer: `peers.cancel_latency_pgqueuer` (`mark_job_as_cancelled` on a separate
  connection, same settle time). In-process samples are taken in blocks that alternate
  tether-PG, PgQueuer and tether-SQLite. p99 is nearest-rank (with 20 samples, the max).
- **Recovery**: a `bench/workerapp.py` worker process (default `WorkerConfig`) takes a job
  that hangs on attempt 1; once `app.get` shows it `running`, a second worker (default
  `WorkerConfig`) starts in the benchmark process, and 0.2-1.2 s later (random, so the
  kill lands anywhere in the second worker's {DEFAULT_CONFIG.rescue_interval:g} s rescue
  cycle) the process gets SIGKILL. The clock stops when attempt 2 starts in the second
  worker's handler; the job must then succeed on attempt 2. The second worker's rescuer
  sees the dead pid on this host, so the {DEFAULT_CONFIG.lease_duration:g} s lease need not
  expire.
- **Memory**: a `bench/workerapp.py` worker process with
  `WorkerConfig(concurrency=N, claim_batch={MEMORY_CLAIM_BATCH},
  stop_timeout={MEMORY_STOP_TIMEOUT:g})`
  and N sleeping jobs (`asyncio.sleep({MEMORY_SLEEP:g})`); VmRSS from `/proc/PID/status`
  once `app.jobs.stats()` shows all N running (+0.5 s), beside the idle RSS before the jobs
  were enqueued and the peak (VmHWM). Then SIGTERM: the jobs outlive `stop_timeout` and
  must all be released to `queued`.
- **Cancellation per executor** (`bench/cancel_executors.py`): a worker in the benchmark
  process (same App as the caller) with `WorkerConfig(concurrency={EXEC_CONFIG.concurrency},
  cancel_grace={EXEC_CONFIG.cancel_grace:g}, cancel_timeout={EXEC_CONFIG.cancel_timeout:g},
  kill_timeout={EXEC_CONFIG.kill_timeout:g})`, other settings default (heartbeat every
  {EXEC_CONFIG.heartbeat_interval:g} s: in-process the request arrives by NOTIFY or by the SQLite
  store's hint and wakes it at once). The handlers stop cooperatively well within those
  bounds, which only keep a misbehaving sample from stalling the run. One job at a time:
  *async* awaits `ctx.cancelled.wait()`; *thread* loops on
  `ctx.cancelled.wait_sync({cancel_executors.THREAD_WAIT:g})` (it returns as soon as the signal
  is set); *process* is a module-level `def` in a child process that loops on
  `ctx.check_cancelled()` with {cancel_executors.PROCESS_POLL * 1000:g} ms sleeps (the worker
  sends SIGTERM, whose handler sets the flag, so the reading lags it by at most one
  sleep) and writes its `perf_counter` readings to mark files (one `CLOCK_MONOTONIC` for
  all processes). Each handler then raises `Cancelled`. {CANCEL_SETTLE * 1000:.0f} ms after the
  handler started, the clock starts just before `app.cancel(id, wait={EXEC_CANCEL_TIMEOUT:g})`
  is started as a task; once it has sent its first query,
  `app.cancellations.wait(id, {EXEC_CANCEL_TIMEOUT:g})` runs beside it. *Handler*: until the
  handler's reading when it saw the request. *wait_cancelled*: until that call returned
  (the job stopped, the worker recorded it, and the cancellation record settled); the
  last column is when `app.cancel()` itself returned. `cancel(wait=0)` followed by
  `wait_cancelled` is not used: with the job still running, `wait=0` settles the record
  at once as `partial` ("still running after 0s"), it stays so after the job ends
  `cancelled`, and `wait_cancelled` returns `(False, ...)` at once. Every job must end
  `cancelled` with a `completed` record. A process job settles only once its child has
  exited (interpreter teardown, some 30 ms). Samples are taken in blocks that interleave
  stores and executors, a fresh database per block. p99 is nearest-rank (with 20 or fewer
  samples, the max).
- **Workflow cascade** (`bench/graphs.py`): a root job, N jobs depending on it and M
  depending on each of those (the table's title gives N and M), enqueued with
  `app.enqueue_workflow` in one transaction (untimed; PostgreSQL inserts linked jobs one
  by one, hence its long enqueue). No worker runs: the root is `queued`, the rest
  `blocked`. Timed: `app.cancel(root, wait={graphs.CASCADE_WAIT:g})`, which cancels the root
  and, in the same transaction, everything downstream, then writes the cancellation
  record (it reads each target's state and artifacts). The store's `request_cancel`,
  that one transaction, is also timed on its own (the method wrapped on the App's store
  instance); the rest is the cancellation service's reads and record. Every job must then be
  `cancelled` (`app.jobs.stats()` on a fresh database) and the record `completed`.
- **Release**: a job A and N jobs that each depend on A alone
  (`app.enqueue_many(..., depends_on=(A,))`, one transaction, untimed), on a queue no
  worker serves so that they stay `queued`. A worker in the benchmark process (A's queue
  only) runs A, whose handler reads `perf_counter` just before it returns. The store's
  `finish()` method is wrapped on that App's store instance to time each call: the
  worker records A's success in one transaction, in which the dependents are queued
  (PostgreSQL's statement trigger; the SQLite store's `_propagate`), so they are all
  `queued` once it returns. *finish()*: that call alone; *A returns -> queued*: from A's
  reading to the call's return (the handler settling, the completer's wake-up, the
  write). *Plain finish()*: the same for a job without dependents, run right after A.
  The N must then be `queued` and A `succeeded`. A fresh database per round; rounds
  alternate the stores.
"""


def check_postgres(dsn: str) -> str | None:
    """``dsn`` if a PostgreSQL server answers there, else ``None`` (with a note)."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=5):
            return dsn
    except psycopg.Error as exc:
        print(f"PostgreSQL unreachable at {dsn}: {exc}; measuring SQLite and Huey only")
        return None


#: The ``--only`` choices, in the order they run.
SECTIONS = [
    "drain",
    "million",
    "scaling",
    "cancel",
    "cancel-executors",
    "recovery",
    "memory",
    "workflows",
]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 if any measurement failed (a MISS alone is not a failure)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description="Benchmark tether against PgQueuer, Procrastinate and Huey."
    )
    parser.add_argument("--quick", action="store_true", help="few jobs and samples: a fast check")
    parser.add_argument("--repeat", type=int, help="drain rounds (default 3; quick 1)")
    parser.add_argument(
        "--jobs", type=int, help="jobs per drain, every system (default 20000; quick 2000)"
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="first find each system's best drain setting by a small sweep and use it for "
        "the tuned rows (default: a preset)",
    )
    parser.add_argument(
        "--no-procrastinate",
        action="store_true",
        help="leave Procrastinate out of the drains (an order of magnitude slower, its "
        "drains take the longest)",
    )
    parser.add_argument(
        "--million-rows",
        type=int,
        help="finished jobs in the table for the million-row drain (default 1000000; quick 100000)",
    )
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="run only these sections (repeatable)",
    )
    parser.add_argument(
        "--dsn",
        default=DEFAULT_ADMIN_DSN,
        help="PostgreSQL database used to CREATE/DROP fresh ones (default: $TETHER_TEST_PG "
        "or %(default)s)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the markdown report (default: bench/RESULTS.md, none with --quick)",
    )
    args = parser.parse_args(argv)

    plan = Plan.quick() if args.quick else Plan()
    overrides = {
        "repeat": args.repeat,
        "jobs": args.jobs,
        "million_rows": args.million_rows,
    }
    plan = Plan(**{**plan.__dict__, **{k: v for k, v in overrides.items() if v is not None}})
    if min(plan.repeat, plan.jobs, plan.million_rows) < 1:
        parser.error("--repeat, --jobs and --million-rows must be at least 1")
    output = args.output if args.output is not None else (None if args.quick else RESULTS_PATH)
    sections = set(args.only or SECTIONS)

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    admin_dsn = check_postgres(args.dsn)
    info = machine_info(admin_dsn)
    print(
        f"tether bench: {info['date']}, {info['nproc']} CPUs, Python {info['python']}, "
        f"PostgreSQL {info['postgres']}, load {info['load']}",
        flush=True,
    )
    durability = fsync.measure(admin_dsn)
    info["fsync"] = durability.lines()
    for key, value in durability.lines().items():
        print(f"  {key}: {value}", flush=True)
    started = time.perf_counter()
    results = Results()
    results.notes += durability.notes
    drainers: list[Drainer] = []
    tuned = PRESET_TUNED
    if args.sweep and sections & {"drain", "million", "scaling"}:
        print(f"\nSweep: {plan.sweep_jobs} jobs per candidate", flush=True)
        tuned = sweep(plan, admin_dsn, results)
        print(
            f"  chosen: tether-pg {_cfg(tuned.tether_pg)}; pgqueuer {tuned.pgq}; "
            f"tether-sqlite {_cfg(tuned.tether_sqlite)}; huey {tuned.huey_workers} threads",
            flush=True,
        )
    if "drain" in sections:
        print(f"\nDrain: {plan.jobs} no-op jobs, {plan.repeat} interleaved rounds", flush=True)
        drainers = measure_drains(plan, admin_dsn, results, tuned, not args.no_procrastinate)
    if "million" in sections:
        print(f"\nDrain beside {plan.million_rows} finished jobs, {plan.repeat} rounds", flush=True)
        measure_million(plan, admin_dsn, results, tuned)
    if "scaling" in sections:
        print(f"\nScaling: {plan.scale_processes} worker processes", flush=True)
        measure_scaling(plan, admin_dsn, results, tuned)
    if "cancel" in sections:
        print(f"\nCancellation latency: {plan.cancel_samples} in-process samples", flush=True)
        measure_cancellation(plan, admin_dsn, results)
    if "cancel-executors" in sections:
        print(
            f"\nCancellation per executor: {plan.exec_samples} samples per store "
            f"(process {plan.exec_process_samples})",
            flush=True,
        )
        measure_executor_cancellation(plan, admin_dsn, results)
    if "recovery" in sections:
        print(f"\nRecovery after kill -9: {plan.recovery_rounds} rounds per store", flush=True)
        measure_recovery(plan, admin_dsn, results)
    if "memory" in sections:
        print(f"\nMemory: {plan.memory_jobs} sleeping jobs in one worker process", flush=True)
        measure_memory(plan, admin_dsn, results)
    if "workflows" in sections:
        print(
            f"\nWorkflows: cancel a {plan.cascade_jobs}-job graph x {plan.cascade_rounds}, "
            f"release {plan.release_dependents} dependents x {plan.release_rounds}",
            flush=True,
        )
        measure_workflows(plan, admin_dsn, results)
    elapsed = time.perf_counter() - started
    info["load_end"] = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    # Measured again at the end: on a shared machine it moves with everyone's writes.
    print("\nDurable writes again, at the end:", flush=True)
    after = fsync.measure(admin_dsn)
    results.notes += after.notes
    info["fsync"] = {
        key: f"start: {value}; end: {after.lines()[key]}" if key in after.lines() else value
        for key, value in info["fsync"].items()
    }
    info["fsync"]["bench temp dir"] = after.where

    tables = build_tables(results, drainers, plan, tuned)
    print(render_console(tables))
    print(f"\n{elapsed / 60:.1f} min; load average {info['load']} -> {info['load_end']}")
    if output is not None:
        report = render_markdown(tables, info, plan, argv, elapsed, results.notes)
        output.write_text(report + kept_sections(output), encoding="utf-8")
        print(f"wrote {output}")
    if results.errors:
        print(f"\n{len(results.errors)} measurement(s) failed:", file=sys.stderr)
        for key, message in results.errors.items():
            print(f"  {key}: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
