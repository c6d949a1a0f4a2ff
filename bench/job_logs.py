"""What a job's own log costs: the time a logged line adds, and the server time per line.

``python bench/job_logs.py`` drains the same jobs three ways on each store, in
interleaved rounds (median of ``--repeat``), with one in-process worker at tether's
defaults:

- ``plain``: ``--jobs`` no-op jobs that log nothing (the baseline);
- ``ctx.log``: the same jobs, each writing ``--lines`` lines with ``ctx.log``;
- ``logging``: the same, each line through a ``logging`` logger inside the handler
  (captured by the worker's handler on the root logger).

It prints jobs/s, lines/s and the time a line adds (``(t_mode - t_plain) / lines``).
The lines of a job that ends at once are written with its outcome (one transaction per
job before the batch's finish), so the figure is a line's share of that write plus its
formatting and buffering. On PostgreSQL it runs in a private throwaway cluster
(``initdb`` in a temp dir, its own port, ``pg_stat_statements`` loaded, ``fsync = off``),
never the shared server, and adds the server time per line: the execution time of the
log's statements (the lease check, the tally, the insert) over the lines written.
SQLite runs on a file in a temp dir at tether's defaults (``synchronous = normal``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.private_pg import private_postgres

from tether import App, JobContext, WorkerConfig

MODES = ("plain", "ctx.log", "logging")
user_log = logging.getLogger("bench.handler")


def build(url: str, lines: int) -> App:
    """The app of one drain: one task per mode."""
    app = App(url)

    @app.task(name="plain")
    async def plain(ctx: JobContext) -> None:
        return None

    @app.task(name="ctx.log")
    async def with_ctx(ctx: JobContext) -> None:
        for i in range(lines):
            ctx.log(f"line {i} of job {ctx.id}")

    @app.task(name="logging")
    async def with_logging(ctx: JobContext) -> None:
        for i in range(lines):
            user_log.info("line %d of job %d", i, ctx.id)

    return app


async def drain(url: str, mode: str, jobs: int, lines: int) -> float:
    """Seconds to drain ``jobs`` jobs of ``mode`` (enqueued first, untimed)."""
    app = build(url, lines)
    try:
        await app.admin.migrate()
        await app.enqueue_many([(mode, {}) for _ in range(jobs)])
        worker = app.worker(WorkerConfig())
        started = time.perf_counter()
        await worker.start()
        try:
            while True:
                counts = await app.jobs.stats()
                if counts["succeeded"] >= jobs:
                    break
                await asyncio.sleep(0.05)
        finally:
            await worker.stop()
        took = time.perf_counter() - started
        if mode != "plain":  # every line is in: none lost, none dropped
            store = await app.store()
            first = (await app.jobs.list(limit=1))[0]
            assert len(await store.logs(first.id)) == lines
        return took
    finally:
        await app.close()


def _server_ms(url: str) -> float:
    """Execution time of the log's own statements, in ms, since the last reset."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(sum(total_exec_time), 0) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database() "
            "AND s.toplevel AND (s.query ILIKE '%%tether_job_logs%%' "
            "OR s.query ILIKE '%%FOR KEY SHARE%%')"
        ).fetchone()
        return float(row[0]) if row else 0.0


def _reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")


async def measure(name: str, make_url: Any, args: argparse.Namespace) -> list[str]:
    """One store's rows of the table."""
    times: dict[str, list[float]] = {m: [] for m in MODES}
    server: list[float] = []
    for r in range(args.repeat + 1):  # the first round warms up, untimed
        order = MODES[r % 3 :] + MODES[: r % 3]
        for mode in order:
            url = make_url(f"{mode.replace('.', '_')}{r}")
            if name == "postgresql" and mode == "ctx.log":
                _reset(url)
            took = await drain(url, mode, args.jobs, args.lines)
            if name == "postgresql" and mode == "ctx.log" and r > 0:
                server.append(_server_ms(url) * 1000 / (args.jobs * args.lines))
            if r > 0:
                times[mode].append(took)
    med = {m: statistics.median(times[m]) for m in MODES}
    lines = args.jobs * args.lines
    rows = []
    for mode in MODES:
        t = med[mode]
        per_line = "" if mode == "plain" else f"{(t - med['plain']) / lines * 1e6:,.0f}"
        rows.append(
            f"| {name} | {mode} | {args.jobs / t:,.0f} | "
            f"{'' if mode == 'plain' else f'{lines / t:,.0f}'} | {per_line} | "
            f"{f'{statistics.median(server):,.1f}' if server and mode == 'ctx.log' else ''} |"
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per drain (1000)")
    parser.add_argument("--lines", type=int, default=10, help="lines per job (10)")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds (3)")
    args = parser.parse_args()
    user_log.setLevel(logging.INFO)
    user_log.propagate = True
    print(
        f"{args.jobs} jobs of {args.lines} lines, one in-process worker at the defaults, "
        f"median of {args.repeat} interleaved rounds after a warm-up\n"
    )
    print("| store | jobs | jobs/s | lines/s | µs a line adds | server µs per line |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        rows = await measure("sqlite", lambda tag: f"sqlite:///{tmp}/{tag}.db", args)
    print("\n".join(rows), flush=True)
    with private_postgres("logs", statements=True) as pg_url:
        rows = await measure("postgresql", pg_url, args)
    print("\n".join(rows))


if __name__ == "__main__":
    asyncio.run(main())
