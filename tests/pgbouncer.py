"""A private PgBouncer in transaction mode, for tests of tether behind a pooler.

PgBouncer is a separate process in front of a database: starting one reconfigures no
server. It listens on a free loopback port with trust auth and hands each transaction
whichever server connection is free, as production poolers do. As root it runs as the
``postgres`` OS user (it refuses to run as root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from tests.pgcluster import free_port


def binary() -> str | None:
    """The ``pgbouncer`` executable (Debian installs it in /usr/sbin), or ``None``."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


class PgBouncer:
    """One PgBouncer in front of the server of ``server_url``; :attr:`url` reaches the
    same database through it."""

    def __init__(self, exe: str, server_url: str, *, server_pool: int = 20) -> None:
        self.exe = exe
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tether-pgbouncer-"))
        server = urlsplit(server_url)
        (self.root / "users.txt").write_text(f'"{server.username or "postgres"}" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server.hostname} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.root}/users.txt\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {server_pool}\n"
            "max_client_conn = 500\n"
            f"logfile = {self.root}/pgbouncer.log\n"
            f"pidfile = {self.root}/pgbouncer.pid\n"
        )
        self._user: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, pw.pw_uid, pw.pw_gid)
            self._user = ["runuser", "-u", "postgres", "--"]
        self.url = urlunsplit(
            server._replace(netloc=f"{server.username or 'postgres'}@127.0.0.1:{self.port}")
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it answers."""
        self._proc = subprocess.Popen(
            [*self._user, self.exe, str(self.root / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2, prepare_threshold=None) as c:
                    c.execute("SELECT 1")
                return
            except psycopg.Error:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise
                time.sleep(0.1)

    def log(self) -> str:
        """What it logged (for a failing test's message)."""
        with contextlib.suppress(OSError):
            return (self.root / "pgbouncer.log").read_text()
        return ""

    def stop(self) -> None:
        """Stop it and remove its files."""
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(10)
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
