"""A private throwaway PostgreSQL for the micro-benchmarks (steps, job logs, hooks): never
the shared server. ``initdb`` in a temp dir, its own port, ``fsync = off`` (it is thrown
away), and optionally ``pg_stat_statements`` for the server time of statements."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pgcluster import make_cluster


@contextlib.contextmanager
def private_postgres(prefix: str, *, statements: bool = False) -> Iterator[Callable[[str], str]]:
    """A function making a fresh database ``<prefix>_<tag>`` of a private cluster and
    returning its URL; the cluster is destroyed on exit. ``statements``: load
    ``pg_stat_statements`` and track every statement."""
    cluster = make_cluster()
    if cluster is None:
        sys.exit("PostgreSQL's binaries (initdb, pg_ctl) are not installed")
    try:
        conf = cluster.data / "postgresql.conf"
        extra = "fsync = off\n"
        if statements:
            extra += "shared_preload_libraries = 'pg_stat_statements'\n"
            extra += "pg_stat_statements.track = all\n"
        conf.write_text(conf.read_text() + extra)
        cluster.restart()
        admin = cluster.admin_url

        def database(tag: str) -> str:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {prefix}_{tag}")
                conn.execute(f"CREATE DATABASE {prefix}_{tag}")
            return admin.rsplit("/", 1)[0] + f"/{prefix}_{tag}"

        yield database
    finally:
        cluster.destroy()
