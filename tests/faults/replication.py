"""A private PostgreSQL primary with a streaming standby, for the failover scenario.

Both are throwaway clusters of :mod:`tests.pgcluster` on ports of their own (never the
shared server). The standby is made with ``pg_basebackup -R`` and, when
``synchronous``, named in the primary's ``synchronous_standby_names`` with
``synchronous_commit = on``: a commit returns only once the standby has it. A failover
stops the primary with ``pg_ctl stop -m immediate`` (a crash: nothing is flushed or
handed over) and promotes the standby. :meth:`ReplicatedPair.rebuild` then makes a new
standby of the new primary on the old primary's port, so that the same multi-host URL
(:meth:`ReplicatedPair.url`) survives any number of failovers.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from tests.pgcluster import PrivateCluster

STANDBY_NAME = "standby1"


def _append(cluster: PrivateCluster, name: str, text: str) -> None:
    """Append settings to one of the cluster's configuration files (as its owner)."""
    cluster._run("sh", "-c", f"cat >> {cluster.data}/{name} <<'EOF'\n{text}\nEOF")


class ReplicatedPair:
    """A primary and one standby; which is which changes with each failover."""

    def __init__(self, bin_dir: Path, *, synchronous: bool = True) -> None:
        self.bin = bin_dir
        self.synchronous = synchronous
        self.primary = PrivateCluster(bin_dir)
        self.standby = PrivateCluster(bin_dir)
        self.ports = (self.primary.port, self.standby.port)
        self.failovers = 0

    def setup(self) -> None:
        """Start the primary, then its standby, and wait until it replicates."""
        self.primary.init()
        _append(
            self.primary,
            "postgresql.conf",
            "wal_level = replica\nmax_wal_senders = 10\nwal_keep_size = '256MB'\n"
            "synchronous_commit = on\n",
        )
        self.primary.start()
        self._make_standby()

    def _make_standby(self) -> None:
        """A new standby of :attr:`primary` in :attr:`standby` (its directory fresh)."""
        sb, pr = self.standby, self.primary
        sb._run(
            str(self.bin / "pg_basebackup"),
            "-D",
            str(sb.data),
            "-h",
            "127.0.0.1",
            "-p",
            str(pr.port),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "--no-sync",
            "--checkpoint=fast",
        )
        # postgresql.auto.conf comes from the primary and wins over postgresql.conf:
        # the standby's own settings go after what it copied. It names no synchronous
        # standby of its own: once promoted it has none until :meth:`rebuild`.
        _append(
            sb,
            "postgresql.auto.conf",
            f"port = {sb.port}\nunix_socket_directories = '{sb.root}'\n"
            f"cluster_name = '{STANDBY_NAME}'\nsynchronous_standby_names = ''\n",
        )
        sb.start()
        names = f"'{STANDBY_NAME}'" if self.synchronous else "''"
        with psycopg.connect(pr.admin_url, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = {names}")  # type: ignore[arg-type]
            conn.execute("SELECT pg_reload_conf()")
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + 60
        while True:
            with psycopg.connect(pr.admin_url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (STANDBY_NAME,),
                ).fetchone()
            if row and row[0] == want:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not {want} after 60 s: {row}")
            time.sleep(0.1)

    def url(self, database: str) -> str:
        """Both servers (either may be the primary), for libpq to find the writable one."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def crash_primary(self) -> None:
        """``pg_ctl stop -m immediate``: the primary goes away as in a crash."""
        pr = self.primary
        pr._run(str(self.bin / "pg_ctl"), "-D", str(pr.data), "-w", "-m", "immediate", "stop")

    def promote(self) -> None:
        """Promote the standby (and wait until it accepts writes); it is the primary now."""
        sb = self.standby
        sb._run(str(self.bin / "pg_ctl"), "-D", str(sb.data), "-w", "-t", "60", "promote")
        self.primary, self.standby = sb, self.primary
        self.failovers += 1

    def rebuild(self) -> None:
        """A new standby of the new primary where the crashed primary was."""
        old = self.standby
        old._run("rm", "-rf", str(old.data))
        self._make_standby()

    def destroy(self) -> None:
        for cluster in (self.primary, self.standby):
            cluster.destroy()
