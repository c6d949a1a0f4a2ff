"""Server connections per tether worker process (PostgreSQL), idle and draining.

Starts N real worker processes (``tether worker``; N = 1, 8 and 32 by default) against a
fresh database on a private cluster of its own (``initdb`` into a temporary directory,
``max_connections = 200``: never the shared server, whose 100 connections 32 workers at
three each would nearly fill). Each worker's URL names its sessions
(``application_name=bench-wNN``), and every 0.1 s the script counts each worker's
backends in ``pg_stat_activity``:

1. **idle**: for ``--idle`` seconds once every worker has registered and ``--settle``
   seconds have passed;
2. **draining**: while the workers drain ``--jobs`` no-op jobs, enqueued beforehand into
   the paused queue; the clock runs from the queue's resume until every job succeeded
   (jobs/s);
3. **idle again**: how long until every worker is back at two backends at most (up to
   ``--recover`` seconds).

``--before DIR`` also runs everything with the workers (and the migrations) from another
checkout's ``src`` (e.g. ``git archive <commit> src | tar -x -C DIR``), alternating with
this checkout's at each N, and prints both. ``--record`` writes the table into the
"Connections" section of ``bench/RESULTS.md``.

Run: ``python bench/connections.py --before /tmp/tether-before/src --record``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from tether import App, JobContext

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SRC = ROOT / "src"
RESULTS = BENCH / "RESULTS.md"
HEADING = "## Connections"
NOOP = "bench.noop"
SAMPLE_EVERY = 0.1

#: What ``tether worker --app connections:app`` runs (its URL comes from --database).
app = App("postgresql://localhost/unused")


@app.task(name=NOOP)
async def noop(ctx: JobContext) -> None:
    """Nothing: the drain measures the queue, not the work."""


async def _nothing(ctx: JobContext) -> None:
    """The producer's declaration of the no-op task (it never runs it)."""


@dataclass
class Run:
    """One measurement: N workers of one checkout."""

    label: str
    workers: int
    idle: list[int] = field(default_factory=list)  # the most each worker held, idle
    draining: list[int] = field(default_factory=list)  # the most each held, draining
    rate: float = 0.0
    recovered: float | None = None  # seconds until every worker held two at most


def _name(i: int) -> str:
    return f"bench-w{i:02d}"


def _tether(src: Path, *args: str) -> subprocess.Popen[bytes]:
    """``tether ARGS`` run from ``src``, its output discarded."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{BENCH}"}
    code = "from tether.cli import main; main()"
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.DEVNULL)


async def _counts(conn: psycopg.AsyncConnection[tuple[str, int]], n: int) -> list[int]:
    cur = await conn.execute(
        "SELECT application_name, count(*) FROM pg_stat_activity "
        "WHERE application_name LIKE 'bench-w%%' GROUP BY 1"
    )
    found = dict(await cur.fetchall())
    return [found.get(_name(i), 0) for i in range(n)]


async def _watch(
    conn: psycopg.AsyncConnection[tuple[str, int]], n: int, until: asyncio.Event
) -> list[int]:
    """The most backends each worker held, sampled until ``until`` is set."""
    most = [0] * n
    while not until.is_set():
        most = [max(a, b) for a, b in zip(most, await _counts(conn, n), strict=True)]
        await asyncio.sleep(SAMPLE_EVERY)
    return most


async def _succeeded(conn: psycopg.AsyncConnection[tuple[str, int]]) -> int:
    cur = await conn.execute("SELECT count(*) FROM tether_jobs WHERE state = 'succeeded'")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def measure(admin_url: str, src: Path, label: str, n: int, args: argparse.Namespace) -> Run:
    """N workers of ``src`` on a fresh database: idle, draining, idle again."""
    db = f"bench_conn_{label}_{n}_{os.getpid()}"
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as admin:
        await admin.execute(f'CREATE DATABASE "{db}"')
    url = admin_url.rsplit("/", 1)[0] + f"/{db}"
    run = Run(label, n)
    procs: list[subprocess.Popen[bytes]] = []
    producer = App(f"{url}?application_name=bench-producer")
    producer.task(name=NOOP)(_nothing)
    try:
        if _tether(src, "migrate", "--database", url).wait() != 0:
            raise RuntimeError("tether migrate failed")
        await producer.queues.pause("default")
        for i in range(n):
            procs.append(
                _tether(
                    src,
                    "worker",
                    "--app",
                    "connections:app",
                    "--database",
                    f"{url}?application_name={_name(i)}",
                    "--log-level",
                    "warning",
                )
            )
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while min(await _counts(conn, n)) == 0 or await _active(conn) < n:
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError("the workers did not all start")
                await asyncio.sleep(0.2)
            await asyncio.sleep(args.settle)
            stop = asyncio.Event()
            watch = asyncio.create_task(_watch(conn, n, stop))
            await asyncio.sleep(args.idle)
            stop.set()
            run.idle = await watch

            for start in range(0, args.jobs, 5000):
                await producer.enqueue_many([(NOOP, {})] * min(5000, args.jobs - start))
            stop = asyncio.Event()
            watch = asyncio.create_task(_watch(conn, n, stop))
            began = time.perf_counter()
            await producer.queues.resume("default")
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as jobs:
                while await _succeeded(jobs) < args.jobs:
                    if time.perf_counter() - began > 600:
                        raise RuntimeError("the drain stalled")
                    await asyncio.sleep(0.05)
            run.rate = args.jobs / (time.perf_counter() - began)
            stop.set()
            run.draining = await watch

            ended = time.perf_counter()
            while time.perf_counter() - ended < args.recover:
                if max(await _counts(conn, n)) <= 2:
                    run.recovered = time.perf_counter() - ended
                    break
                await asyncio.sleep(SAMPLE_EVERY)
        return run
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        await producer.close()
        async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as admin:
            await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


async def _active(conn: psycopg.AsyncConnection[tuple[str, int]]) -> int:
    cur = await conn.execute("SELECT count(*) FROM tether_workers WHERE state = 'active'")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


def _spread(values: list[int]) -> str:
    low, high = min(values), max(values)
    return str(high) if low == high else f"{low}-{high}"


def table(runs: list[Run]) -> list[str]:
    """The results as markdown table lines."""
    lines = [
        "| code | workers | idle: backends per worker (most seen) | idle: sum over workers | "
        "draining: per worker | draining: sum over workers | drain jobs/s | back to <= 2 after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        back = f"{r.recovered:.1f} s" if r.recovered is not None else "not within the watch"
        lines.append(
            f"| {r.label} | {r.workers} | {_spread(r.idle)} | {sum(r.idle)} | "
            f"{_spread(r.draining)} | {sum(r.draining)} | {r.rate:.0f} | {back} |"
        )
    return lines


def record(lines: list[str], args: argparse.Namespace) -> None:
    """Write the section ``## Connections`` of RESULTS.md (replacing an older one)."""
    section = [
        HEADING,
        "",
        f"Written by `bench/connections.py` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC "
        f"({platform.machine()}, {os.cpu_count()} cores, PostgreSQL {args.server}, a private "
        f"cluster; load average {args.load} at the start). Backends of each `tether worker` "
        "process in `pg_stat_activity` by its `application_name`, sampled every "
        f"{SAMPLE_EVERY:g} s: idle for {args.idle:g} s after {args.settle:g} s to settle, then "
        f"while the workers drain {args.jobs} no-op jobs (the drain's jobs/s beside), then "
        f"how long until each is back at two at most (watched {args.recover:g} s). "
        '"before" is the code the change started from, run by the same script.',
        "",
        *lines,
        "",
    ]
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    start = text.find(HEADING)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + "\n".join(section)
    else:
        end = text.find("\n## ", start + len(HEADING))
        text = text[:start] + "\n".join(section) + (text[end + 1 :] if end >= 0 else "")
    RESULTS.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, and with ``--record`` write it into RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds watched idle")
    parser.add_argument("--settle", type=float, default=25.0, help="seconds before the watch")
    parser.add_argument("--recover", type=float, default=40.0, help="seconds watched after")
    parser.add_argument("--before", type=Path, help="another checkout's src, run alternately")
    parser.add_argument("--dsn", help="an admin URL of a server to use instead of a private one")
    parser.add_argument("--record", action="store_true", help="write the table into RESULTS.md")
    args = parser.parse_args(argv)
    args.load = "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())

    cluster = None
    admin_url = args.dsn
    if admin_url is None:
        sys.path.insert(0, str(ROOT))
        from tests.pgcluster import make_cluster

        cluster = make_cluster()
        if cluster is None:
            parser.error("PostgreSQL's initdb and pg_ctl are not installed: give --dsn")
        admin_url = cluster.admin_url
    with psycopg.connect(admin_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    args.server = row[0] if row else "?"
    sources = [("after", SRC)] if args.before is None else [("before", args.before), ("after", SRC)]
    runs: list[Run] = []
    try:
        for n in args.workers:
            for label, src in sources:
                print(f"{label}: {n} worker(s)...", flush=True)
                runs.append(asyncio.run(measure(admin_url, src, label, n, args)))
                print("\n".join(table(runs[-1:])[2:]), flush=True)
    finally:
        if cluster is not None:
            cluster.destroy()
    lines = table(runs)
    print("\n".join(lines))
    if args.record:
        record(lines, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
