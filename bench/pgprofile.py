"""Where a PostgreSQL drain spends its time: statements on the server, CPU in the client.

``python bench/pgprofile.py`` starts a private throwaway cluster (``initdb`` in a temp
dir, its own port) with ``pg_stat_statements`` loaded, so the shared server is never
reconfigured. In it, it drains ``--jobs`` no-op jobs once with tether and once with
PgQueuer at matched settings, and prints for each:

- the jobs/s, and the clients' CPU time per job: the benchmark process's
  (``time.process_time``: enqueueing, counting) and its consumer processes' (``getrusage``
  of the children, once they have exited, their start-up included: a few hundred ms of
  imports, small beside the default 20,000 jobs);
- the statements that took the most server time, with calls, total and per-job time.

The cluster runs with ``fsync = off`` (it is thrown away); compare the two systems with
each other, not with ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
from run import DEFAULT_CONFIG, DRAIN_CONFIG, PgqSetting, pgqueuer_drain, tether_drain
from tests.pgcluster import make_cluster
from tether import WorkerConfig

TOP = 14


def _reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")


def _report(url: str, jobs: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        total = conn.execute(
            "SELECT sum(total_exec_time) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = current_database() AND s.toplevel"
        ).fetchone()
        rows = conn.execute(
            "SELECT calls, total_exec_time, toplevel, regexp_replace(query, '\\s+', ' ', 'g') "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = current_database() ORDER BY total_exec_time DESC LIMIT %s",
            (TOP,),
        ).fetchall()
    all_ms = float(total[0] or 0) if total else 0.0
    print(f"  server time: {all_ms:.0f} ms in all, {1000 * all_ms / jobs:.1f} µs per job")
    print("  (nested: run inside a function or trigger; its time is also its caller's)")
    for calls, ms, toplevel, query in rows:
        where = "" if toplevel else "nested "
        per_job = 1000 * ms / jobs
        print(f"  {calls:>7} calls {ms:9.1f} ms {per_job:7.1f} µs/job  {where}{query[:90]}")


def _cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _measure(label: str, url: str, jobs: int, drain: Callable[[Path], float]) -> None:
    _reset(url)
    cpu = _cpu()
    with tempfile.TemporaryDirectory(prefix="pgprofile_") as tmp:
        rate = drain(Path(tmp))
    cpu = _cpu() - cpu
    print(f"{label}: {rate:.0f} jobs/s, client CPU {1e6 * cpu / jobs:.0f} µs per job")
    _report(url, jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per drain (20000)")
    parser.add_argument(
        "--pairing",
        choices=("tuned", "defaults"),
        default="tuned",
        help="tuned: tether concurrency 200 / claim_batch 50 vs PgQueuer batch_size 50; "
        "defaults: WorkerConfig() vs PgQueuer's defaults (default: tuned)",
    )
    args = parser.parse_args()
    config: WorkerConfig = DRAIN_CONFIG if args.pairing == "tuned" else DEFAULT_CONFIG
    batch = 50 if args.pairing == "tuned" else peers.PGQ_BATCH_SIZE
    cluster = make_cluster()
    if cluster is None:
        sys.exit("PostgreSQL's binaries (initdb, pg_ctl) are not installed")
    try:
        with open(cluster.data / "postgresql.conf", "a") as conf:
            # "all": statements inside functions and triggers are counted too.
            conf.write(
                "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = all\n"
            )
        cluster.restart()
        admin = cluster.admin_url
        with peers.fresh_database(admin, "profile_tether") as url:
            _measure(
                f"tether ({args.pairing})",
                url,
                args.jobs,
                lambda tmp: asyncio.run(tether_drain(url, args.jobs, config, tmp))[0],
            )
        with peers.fresh_database(admin, "profile_pgq") as url:
            _measure(
                f"pgqueuer (batch_size={batch})",
                url,
                args.jobs,
                lambda tmp: pgqueuer_drain(url, args.jobs, PgqSetting(batch), tmp),
            )
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
