"""A private, throwaway PostgreSQL cluster for tests that stop or restart the server.

Stopping or restarting a shared server breaks everyone else connected to it, so such
tests get a cluster of their own: ``initdb`` into a temporary directory, started with
``pg_ctl`` on a free loopback port (its unix socket in that directory, trust auth),
stopped and removed at the end. ``initdb`` and ``postgres`` refuse to run as root; as
root they run as the ``postgres`` OS user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg


def bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` live: ``pg_config --bindir``, else the newest
    ``/usr/lib/postgresql/*/bin``; ``None`` if PostgreSQL is not installed."""
    candidates: list[str] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["pg_config", "--bindir"], check=True, capture_output=True, text=True, timeout=10
        )
        candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    return None


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """One throwaway cluster; :meth:`stop`, :meth:`start` and :meth:`restart` act on it
    alone, never on any other server."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tether-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._user: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._user = ["runuser", "-u", "postgres", "--"]
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        #: The environment of its commands (the server's too); None: this process's.
        self.env: dict[str, str] | None = None

    def _run(self, *args: str, timeout: float = 120) -> None:
        subprocess.run(
            [*self._user, *args],
            check=True,
            capture_output=True,
            timeout=timeout,
            cwd=self.root,
            env=self.env,
        )

    def init(self) -> None:
        """``initdb`` with trust auth, listening on loopback at :attr:`port` only."""
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        conf = (
            f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
            f"unix_socket_directories = '{self.root}'\nfsync = off\n"
            "max_connections = 200\n"
        )
        self._run("sh", "-c", f"cat >> {self.data}/postgresql.conf <<'EOF'\n{conf}EOF")

    def ctl(self, action: str, *extra: str) -> None:
        """``pg_ctl <action>`` on this cluster (``start`` and ``stop`` wait)."""
        args = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60"]
        if action in ("start", "restart"):
            args += ["-l", str(self.log)]
        if action in ("stop", "restart"):
            args += ["-m", "fast"]
        self._run(*args, action, *extra)

    def start(self) -> None:
        """Start it (and wait until it accepts connections)."""
        self.ctl("start")

    def stop(self) -> None:
        """Stop it (fast shutdown: connections are closed)."""
        self.ctl("stop")

    def restart(self) -> None:
        """Restart it."""
        self.ctl("restart")

    def up(self) -> bool:
        """Whether it accepts connections now."""
        try:
            with psycopg.connect(self.admin_url, connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def ensure_started(self) -> None:
        """Start it if it is down (the ``finally`` of every stop)."""
        if not self.up():
            with contextlib.suppress(subprocess.SubprocessError):
                self.start()

    def destroy(self) -> None:
        """Stop it (immediately) and remove its files."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run(
                str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-m", "immediate", "stop"
            )
        shutil.rmtree(self.root, ignore_errors=True)


def make_cluster() -> PrivateCluster | None:
    """A started private cluster, or ``None`` if PostgreSQL's binaries are missing."""
    found = bindir()
    if found is None:
        return None
    cluster = PrivateCluster(found)
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        cluster.destroy()
        raise
    return cluster
