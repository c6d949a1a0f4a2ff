"""Scale-out costs of tether on one PostgreSQL: what each worker costs the database.

Runs on a private PostgreSQL cluster of its own (``initdb`` into a temporary directory,
its own port, ``pg_stat_statements`` loaded, ``fsync`` off), never the shared server,
and measures:

1. **Idle cost per worker** at 1, 8, 32 and 64 workers (``--idle``): statements per
   second (``pg_stat_statements``), rows read per second (``pg_stat_database``:
   ``tup_returned + tup_fetched``), database time per second, and server connections,
   over ``--window`` seconds once the workers have settled. Workers run as several
   to a process (``--per-process``), each with its own App, pool and LISTEN connection,
   exactly as separate processes would; only the Python interpreters are shared.
2. **Drain by process count** (``--drain``): no-op jobs bulk-enqueued first, then P
   worker processes drain them together; jobs/s, and the ratio to one process.
   Also the WAL and the rows written per job (``pg_current_wal_lsn`` before and after).
3. **Long-job heartbeat cost** (``--long``): W workers each holding J sleeping jobs;
   statements and rows read per second while they run.

``--tether-src DIR`` runs the workers (and migrations) from another checkout's ``src``,
to measure an older version with the same procedure. ``--quick`` shortens every window.
Run: ``python bench/scale.py --quick --output bench/SCALE.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.pgcluster import PrivateCluster, bindir  # noqa: E402

NOOP = "scale.noop"
SLEEP = "scale.sleep"

# -- the worker processes ------------------------------------------------------------------

CHILD = r"""
import asyncio, logging, sys
from tether import App, Worker, WorkerConfig

url, workers, concurrency, pool = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
logging.basicConfig(level=logging.WARNING)

def make_app():
    app = App(url if pool == "-" else f"{url}?pool_size={pool}")

    @app.task(name="scale.noop")
    async def noop(ctx) -> None:
        return None

    @app.task(name="scale.sleep")
    async def sleep(ctx, seconds: float) -> None:
        await asyncio.sleep(seconds)

    return app

async def main():
    apps = [make_app() for _ in range(workers)]
    running = [Worker(app, WorkerConfig(concurrency=concurrency)) for app in apps]
    for w in running:
        await w.start()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    for w in running:
        await w.stop()
    for app in apps:
        await app.close()

asyncio.run(main())
"""


@dataclass
class Fleet:
    """Worker processes started by :func:`start_fleet`."""

    procs: list[subprocess.Popen[str]]

    def stop(self) -> None:
        for p in self.procs:
            if p.stdin:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def env_for(src: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def start_fleet(
    url: str, workers: int, per_process: int, *, concurrency: int, pool: str, src: Path | None
) -> Fleet:
    """``workers`` workers, ``per_process`` to a process; returns once all are ready."""
    procs = []
    left = workers
    while left:
        n = min(per_process, left)
        left -= n
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD, url, str(n), str(concurrency), pool],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env_for(src),
            )
        )
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"a worker process did not start (exit {p.poll()})")
    return Fleet(procs)


# -- measuring -----------------------------------------------------------------------------


def snapshot(admin: str, db: str) -> dict[str, float]:
    """Counters of database ``db`` now."""
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT tup_returned + tup_fetched, xact_commit, tup_inserted + tup_updated "
            "+ tup_deleted FROM pg_stat_database WHERE datname = %s",
            (db,),
        ).fetchone()
        stm = conn.execute(
            "SELECT COALESCE(sum(calls), 0), COALESCE(sum(total_exec_time), 0) "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s",
            (db,),
        ).fetchone()
        conns = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db,)
        ).fetchone()
        wal = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row and stm and conns and wal
    return {
        "rows_read": float(row[0]),
        "commits": float(row[1]),
        "rows_written": float(row[2]),
        "statements": float(stm[0]),
        "exec_ms": float(stm[1]),
        "connections": float(conns[0]),
        "wal": float(wal[0]),
    }


def top_statements(admin: str, db: str, seconds: float) -> list[tuple[str, float, float]]:
    """(statement, calls/s, rows/s) of the most frequent statements since the reset."""
    with psycopg.connect(admin, autocommit=True) as conn:
        found = conn.execute(
            "SELECT regexp_replace(left(query, 70), '\\s+', ' ', 'g'), calls, rows "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s ORDER BY calls DESC LIMIT 8",
            (db,),
        ).fetchall()
    return [(str(q), c / seconds, r / seconds) for q, c, r in found]


def updates(url: str) -> tuple[int, int]:
    """(updates, HOT updates) of ``tether_jobs`` so far."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tether_jobs'"
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def rate(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    out = {k: (after[k] - before[k]) / seconds for k in before if k != "connections"}
    out["connections"] = after["connections"]
    return out


def flush_stats(admin: str) -> None:
    """pg_stat_database is flushed by each backend from time to time: wait it out."""
    time.sleep(1.2)


def fresh_db(cluster: PrivateCluster, src: Path | None) -> tuple[str, str]:
    name = f"scale_{secrets.token_hex(4)}"
    with psycopg.connect(cluster.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = cluster.admin_url.rsplit("/", 1)[0] + f"/{name}"
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import asyncio,sys; from tether import App; "
            "asyncio.run(App(sys.argv[1]).admin.migrate())",
            url,
        ],
        check=True,
        env=env_for(src),
    )
    return name, url


def idle_cost(
    cluster: PrivateCluster, counts: list[int], args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows = []
    for n in counts:
        name, url = fresh_db(cluster, args.tether_src)
        fleet = start_fleet(
            url, n, args.per_process, concurrency=10, pool=args.pool, src=args.tether_src
        )
        try:
            time.sleep(args.settle)
            flush_stats(cluster.admin_url)
            with psycopg.connect(cluster.admin_url, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
            before = snapshot(cluster.admin_url, name)
            time.sleep(args.window)
            flush_stats(cluster.admin_url)
            after = snapshot(cluster.admin_url, name)
            top = top_statements(cluster.admin_url, name, args.window + 1.2)
        finally:
            fleet.stop()
        r = rate(before, after, args.window + 1.2)
        rows.append({"workers": n, **r, "top": top})
        print(
            f"idle {n:>3} workers: {r['statements']:8.1f} stmt/s "
            f"({r['statements'] / n:6.2f}/worker), {r['rows_read']:10.0f} rows read/s "
            f"({r['rows_read'] / n:8.1f}/worker), {r['exec_ms']:7.1f} ms/s db time, "
            f"{r['connections']:.0f} connections ({r['connections'] / n:.2f}/worker)",
            flush=True,
        )
    return rows


ENQUEUE = r"""
import asyncio, json, sys
from tether import App

url, task, jobs, args, queue = sys.argv[1:]
jobs, args = int(jobs), json.loads(args)

async def main():
    app = App(url)

    @app.task(name=task)
    async def stub(ctx, **kw) -> None:
        return None

    for start in range(0, jobs, 1000):
        await app.enqueue_many([(task, args)] * min(1000, jobs - start), queue=queue)
    await app.close()

asyncio.run(main())
"""


def enqueue(
    url: str,
    task: str,
    jobs: int,
    args: dict[str, Any],
    *,
    src: Path | None,
    queue: str = "default",
) -> None:
    """Bulk-enqueue with the tether under test (it must not migrate the database)."""
    subprocess.run(
        [sys.executable, "-c", ENQUEUE, url, task, str(jobs), json.dumps(args), queue],
        check=True,
        env=env_for(src),
    )


def count_done(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM tether_jobs WHERE state = 'succeeded'").fetchone()
    return int(row[0]) if row else 0


def drain(
    cluster: PrivateCluster, procs: list[int], args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows = []
    for p in procs:
        name, url = fresh_db(cluster, args.tether_src)
        # Enqueued into a queue nobody serves; released into the workers' queue in one
        # statement once every process is up, so the clock covers the drain alone.
        enqueue(url, NOOP, args.jobs, {}, src=args.tether_src, queue="parked")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")  # the statistics a real database would have
        fleet = start_fleet(url, p, 1, concurrency=10, pool=args.pool, src=args.tether_src)
        try:
            time.sleep(1.0)
            before = snapshot(cluster.admin_url, name)
            started = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("UPDATE tether_jobs SET queue = 'default' WHERE queue = 'parked'")
                conn.execute("NOTIFY tether_enqueued, 'default'")
            while count_done(url) < args.jobs:
                time.sleep(0.02)
            elapsed = time.perf_counter() - started
        finally:
            fleet.stop()
        flush_stats(cluster.admin_url)
        after = snapshot(cluster.admin_url, name)
        with psycopg.connect(url) as conn:
            ev = conn.execute("SELECT count(*) FROM tether_job_events").fetchone()
        row = {
            "processes": p,
            "jobs_per_s": args.jobs / elapsed,
            "wal_per_job": (after["wal"] - before["wal"]) / args.jobs,
            "rows_written_per_job": (after["rows_written"] - before["rows_written"]) / args.jobs,
            "events_per_job": (ev[0] if ev else 0) / args.jobs,
        }
        rows.append(row)
        print(
            f"drain {p:>2} processes: {row['jobs_per_s']:7.0f} jobs/s, "
            f"WAL {row['wal_per_job']:.0f} B/job, "
            f"{row['rows_written_per_job']:.1f} rows written/job",
            flush=True,
        )
    return rows


def long_jobs(cluster: PrivateCluster, args: argparse.Namespace) -> dict[str, Any]:
    workers, per = args.long_workers, args.long_jobs
    name, url = fresh_db(cluster, args.tether_src)
    enqueue(url, SLEEP, workers * per, {"seconds": 3600.0}, src=args.tether_src)
    fleet = start_fleet(
        url, workers, args.per_process, concurrency=per, pool=args.pool, src=args.tether_src
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with psycopg.connect(url) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM tether_jobs WHERE state = 'running'"
                ).fetchone()
            if row and row[0] >= workers * per:
                break
            time.sleep(0.5)
        time.sleep(args.settle)
        flush_stats(cluster.admin_url)
        with psycopg.connect(cluster.admin_url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        before = snapshot(cluster.admin_url, name)
        upd_before = updates(url)
        time.sleep(args.window)
        flush_stats(cluster.admin_url)
        after = snapshot(cluster.admin_url, name)
        upd_after = updates(url)
        top = top_statements(cluster.admin_url, name, args.window + 1.2)
    finally:
        fleet.stop()
    r = rate(before, after, args.window + 1.2)
    upd = upd_after[0] - upd_before[0]
    r["hot_share"] = (upd_after[1] - upd_before[1]) / upd if upd else 0.0
    for q, c, rr in top[:5]:
        print(f"    {c:7.1f}/s {rr:9.1f} rows/s  {q}")
    print(
        f"long jobs ({workers} workers x {per} running): {r['statements']:.1f} stmt/s, "
        f"{r['rows_read']:.0f} rows read/s, {r['rows_written']:.0f} rows written/s, "
        f"WAL {r['wal'] / 1024:.1f} KiB/s, {r['hot_share']:.0%} of job updates HOT",
        flush=True,
    )
    return {"workers": workers, "jobs": per, **r, "top": top}


# -- report --------------------------------------------------------------------------------


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        "# tether scale-out costs",
        "",
        f"Written by `python bench/scale.py{' --quick' if args.quick else ''}` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"PostgreSQL {results['server']} (a private cluster, fsync off, "
        "pg_stat_statements loaded).",
        "",
    ]
    for label, res in results["runs"].items():
        lines += [f"## {label}", ""]
        if res.get("idle"):
            lines += [
                f"Idle workers (concurrency 10, nothing to do), per second over {args.window:g} s:",
                "",
                "| workers | statements/s | per worker | rows read/s | per worker "
                "| db time ms/s | connections | per worker |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for r in res["idle"]:
                n = r["workers"]
                lines.append(
                    f"| {n} | {r['statements']:.1f} | {r['statements'] / n:.2f} "
                    f"| {r['rows_read']:.0f} | {r['rows_read'] / n:.1f} "
                    f"| {r['exec_ms']:.1f} | {r['connections']:.0f} "
                    f"| {r['connections'] / n:.2f} |"
                )
            biggest = res["idle"][-1]
            lines += [
                "",
                f"The most frequent statements at {biggest['workers']} idle workers:",
                "",
                "| statement | calls/s | rows/s |",
                "|---|---:|---:|",
            ]
            for q, c, rr in biggest.get("top", []):
                q = q.replace("|", "\\|")
                lines.append(f"| `{q}` | {c:.1f} | {rr:.1f} |")
            lines.append("")
        if res.get("drain"):
            one = res["drain"][0]["jobs_per_s"]
            lines += [
                f"Drain of {args.jobs} no-op jobs by P worker processes (concurrency 10 "
                "each), from the moment the jobs are released into the started workers' "
                "queue until the last one succeeded:",
                "",
                "| processes | jobs/s | vs 1 process | WAL bytes/job | rows written/job "
                "| events/job |",
                "|---:|---:|---:|---:|---:|---:|",
            ]
            for r in res["drain"]:
                lines.append(
                    f"| {r['processes']} | {r['jobs_per_s']:.0f} | {r['jobs_per_s'] / one:.2f}x "
                    f"| {r['wal_per_job']:.0f} | {r['rows_written_per_job']:.1f} "
                    f"| {r['events_per_job']:.1f} |"
                )
            lines.append("")
        if res.get("long"):
            r = res["long"]
            lines += [
                f"Long jobs: {r['workers']} workers each running {r['jobs']} sleeping jobs: "
                f"{r['statements']:.1f} statements/s, {r['rows_read']:.0f} rows read/s, "
                f"{r['rows_written']:.0f} rows written/s, {r['wal'] / 1024:.1f} KiB WAL/s, "
                f"{r.get('hot_share', 0.0):.0%} of the job row updates HOT.",
                "",
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short windows: a fast check")
    parser.add_argument("--idle", default="1,8,32,64", help="worker counts for the idle cost")
    parser.add_argument("--drain", default="1,2,4,8,16", help="process counts for the drain")
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per drain")
    parser.add_argument("--long-workers", type=int, default=8, help="workers of the long-job run")
    parser.add_argument("--long-jobs", type=int, default=50, help="running jobs per worker")
    parser.add_argument("--per-process", type=int, default=8, help="idle workers per process")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument(
        "--pool", default="-", help="pool_size URL parameter of the workers ('-': default)"
    )
    parser.add_argument(
        "--tether-src", type=Path, help="run workers from this checkout's src (e.g. older code)"
    )
    parser.add_argument("--label", default="this checkout", help="heading of this run")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: idle,drain,long")
    parser.add_argument("--output", type=Path, help="write the markdown report here")
    parser.add_argument("--json", type=Path, help="also write (or add to) raw results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.window, args.settle = min(args.window, 8.0), min(args.settle, 4.0)
        args.jobs = min(args.jobs, 10000)
        args.drain = "1,4,16" if args.drain == "1,2,4,8,16" else args.drain
    found = bindir()
    if found is None:
        print("PostgreSQL's initdb and pg_ctl are needed", file=sys.stderr)
        return 2
    cluster = PrivateCluster(found)
    try:
        cluster.init()
        with open(cluster.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\nshared_preload_libraries = 'pg_stat_statements'\nmax_connections = 400\n"
                "pg_stat_statements.track = top\n"
            )
        cluster.start()
        with psycopg.connect(cluster.admin_url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            server = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        skip = set(args.skip.split(","))
        res: dict[str, Any] = {}
        if "idle" not in skip:
            res["idle"] = idle_cost(cluster, [int(x) for x in args.idle.split(",")], args)
        if "drain" not in skip:
            res["drain"] = drain(cluster, [int(x) for x in args.drain.split(",")], args)
        if "long" not in skip:
            res["long"] = long_jobs(cluster, args)
    finally:
        cluster.destroy()
    results: dict[str, Any] = {"server": server, "runs": {}}
    if args.json and args.json.exists():
        results = json.loads(args.json.read_text())
    # A later run under the same label replaces only the parts it measured.
    results["runs"].setdefault(args.label, {}).update(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.output:
        args.output.write_text(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
