"""What a durable step costs: steps per second, and the server time per step.

``python bench/steps.py`` drains the same jobs three ways on each store, in interleaved
rounds (median of ``--repeat``), with one in-process worker at tether's defaults:

- ``plain``: ``--jobs`` no-op jobs, no steps (the baseline);
- ``steps``: the same jobs, each running ``--steps`` no-op steps (``ctx.step``), so
  every step is one fenced write;
- ``fenced``: the same, each step inside ``ctx.transaction()`` (a connection of its
  own per transaction, a lease check, the step's record and one row of the user's,
  committed together).

It prints jobs/s, steps/s and the time a step adds (``(t_steps - t_plain) / steps``).
On PostgreSQL it runs in a private throwaway cluster (``initdb`` in a temp dir, its own
port, ``pg_stat_statements`` loaded, ``fsync = off``: it is thrown away), never the
shared server, and adds the server time per step: the step statements' total execution
time over the steps run. SQLite runs on a file in a temp dir at tether's defaults
(``synchronous = normal``). Compare the rows with each other, not with
``bench/RESULTS.md``'s drains.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
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

MODES = ("plain", "steps", "fenced")


def build(url: str, steps: int) -> App:
    """The app of one drain: one task per mode."""
    app = App(url)

    @app.task(name="plain")
    async def plain(ctx: JobContext) -> None:
        return None

    @app.task(name="steps")
    async def stepped(ctx: JobContext) -> None:
        for i in range(steps):
            await ctx.step(f"s{i}", _noop, i)

    @app.task(name="fenced")
    async def fenced(ctx: JobContext) -> None:
        for i in range(steps):

            async def write(i: int = i) -> int:
                async with ctx.transaction() as conn:
                    sql = "INSERT INTO bench_effects (job_id, step) VALUES (%s, %s)"
                    if isinstance(conn, sqlite3.Connection):
                        conn.execute(sql.replace("%s", "?"), (ctx.id, i))
                    else:
                        await conn.execute(sql, (ctx.id, i))
                return i

            await ctx.step(f"s{i}", write)

    return app


def _noop(i: int) -> int:
    return i


async def drain(url: str, mode: str, jobs: int, steps: int) -> float:
    """Seconds to drain ``jobs`` jobs of ``mode`` (enqueued first, untimed)."""
    app = build(url, steps)
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
        return took
    finally:
        await app.close()


def _effects_table(url: str) -> None:
    sql = "CREATE TABLE IF NOT EXISTS bench_effects (job_id BIGINT, step INT)"
    if url.startswith("sqlite"):
        from tether.store import parse_sqlite_path

        with sqlite3.connect(parse_sqlite_path(url)) as conn:
            conn.execute(sql)
    else:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql)


def _server_ms(url: str) -> float:
    """Execution time of the steps' own statements (the record, with its lease check, and
    the read of a job's steps), in ms, since the last reset."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(sum(total_exec_time), 0) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database() "
            "AND s.toplevel AND (s.query ILIKE '%%tether_save_step%%' "
            "OR s.query ILIKE '%%FROM tether_steps%%')"
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
            url = make_url(f"{mode}{r}")
            _effects_table(url)
            if name == "postgresql" and mode == "steps":
                _reset(url)
            took = await drain(url, mode, args.jobs, args.steps)
            if name == "postgresql" and mode == "steps" and r > 0:
                server.append(_server_ms(url) * 1000 / (args.jobs * args.steps))
            if r > 0:
                times[mode].append(took)
    med = {m: statistics.median(times[m]) for m in MODES}
    steps = args.jobs * args.steps
    rows = []
    for mode in MODES:
        t = med[mode]
        per_step = "" if mode == "plain" else f"{(t - med['plain']) / steps * 1e6:,.0f}"
        rows.append(
            f"| {name} | {mode} | {args.jobs / t:,.0f} | "
            f"{'' if mode == 'plain' else f'{steps / t:,.0f}'} | {per_step} | "
            f"{f'{statistics.median(server):,.0f}' if server and mode == 'steps' else ''} |"
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per drain (1000)")
    parser.add_argument("--steps", type=int, default=10, help="steps per job (10)")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds (3)")
    args = parser.parse_args()
    print(
        f"{args.jobs} jobs of {args.steps} steps, one in-process worker at the defaults, "
        f"median of {args.repeat} interleaved rounds after a warm-up\n"
    )
    print("| store | jobs | jobs/s | steps/s | µs a step adds | server µs per step |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        rows = await measure("sqlite", lambda tag: f"sqlite:///{tmp}/{tag}.db", args)
    print("\n".join(rows), flush=True)
    with private_postgres("steps", statements=True) as pg_url:
        rows = await measure("postgresql", pg_url, args)
    print("\n".join(rows))


if __name__ == "__main__":
    asyncio.run(main())
