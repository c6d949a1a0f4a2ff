"""What a durable write costs on this machine, reported beside the drains.

Every system in the drains makes each finished job durable, and what that costs is the
machine's fsync latency more than anything in the queue: the same code is several times
faster or slower on another disk. So the benchmark measures it where it writes:

- :func:`write_fsync`: a loop of one 8 kB ``pwrite`` and ``os.fsync`` on a file in the
  directory the SQLite drains write to (a fresh temporary directory);
- :func:`pg_test_fsync`: PostgreSQL's own ``pg_test_fsync`` there, if installed: its
  ``fdatasync`` line (one 8 kB write, the default ``wal_sync_method`` on Linux);
- :func:`pg_commit`: one-row INSERTs, each its own transaction, with
  ``synchronous_commit=on`` on a table of a fresh database: the server's commit latency,
  WAL flush included, on whatever disk holds its data directory.

Run by hand: ``python bench/fsync.py [--dsn ...]``.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import peers

SAMPLES = 200
BLOCK = 8192


@dataclass(frozen=True)
class FsyncReport:
    """The three measurements; ``None`` where one could not be taken (and why, in notes)."""

    write_fsync: list[float]
    pg_test_fsync_us: float | None
    pg_commit: list[float] | None
    #: The temporary directory's file system and device, and whether PostgreSQL's data
    #: directory is on the same device.
    where: str
    notes: list[str]

    def lines(self) -> dict[str, str]:
        """Rows for the report's header table."""
        out = {"bench temp dir": self.where}
        out["fsync, 8 kB write + fsync (bench temp dir)"] = _p50_p99(self.write_fsync)
        out["pg_test_fsync, fdatasync of one 8 kB write"] = (
            f"{self.pg_test_fsync_us / 1000:.2f} ms/op"
            if self.pg_test_fsync_us is not None
            else "not measured"
        )
        out["PostgreSQL commit, one-row INSERT, synchronous_commit=on"] = (
            _p50_p99(self.pg_commit) if self.pg_commit else "not measured"
        )
        return out


def _p50_p99(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[max(0, -(-99 * len(ordered) // 100) - 1)]
    return (
        f"p50 {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms "
        f"({len(ordered)} samples)"
    )


def write_fsync(directory: str, samples: int = SAMPLES) -> list[float]:
    """Seconds per 8 kB ``pwrite`` + ``fsync`` of one file in ``directory``."""
    path = os.path.join(directory, "fsync.probe")
    block = os.urandom(BLOCK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    out = []
    try:
        os.pwrite(fd, block, 0)
        os.fsync(fd)
        for _ in range(samples):
            start = time.perf_counter()
            os.pwrite(fd, block, 0)
            os.fsync(fd)
            out.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.remove(path)
    return out


def _pg_test_fsync_binary() -> str | None:
    found = shutil.which("pg_test_fsync")
    if found is not None:
        return found
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_test_fsync"))
    return candidates[-1] if candidates else None


def pg_test_fsync(directory: str) -> float | None:
    """``pg_test_fsync``'s fdatasync time for one 8 kB write, in µs; ``None`` if absent."""
    binary = _pg_test_fsync_binary()
    if binary is None:
        return None
    out = subprocess.run(
        [binary, "-s", "1", "-f", os.path.join(directory, "pg_test_fsync.out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    # The first section compares the sync methods on one 8 kB write; fdatasync's line
    # reads "fdatasync   1234.567 ops/sec   810 usecs/op".
    section = out.split("Compare file sync methods using one", 1)[-1]
    match = re.search(r"^\s*fdatasync\s+[\d.]+ ops/sec\s+([\d.]+) usecs/op", section, re.M)
    return float(match.group(1)) if match else None


def pg_commit(admin_dsn: str, samples: int = SAMPLES) -> list[float]:
    """Seconds per one-row INSERT in its own transaction, ``synchronous_commit=on``."""
    import psycopg

    with (
        peers.fresh_database(admin_dsn, "bench_fsync") as dsn,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        conn.execute("SET synchronous_commit = on")
        conn.execute("CREATE TABLE fsync_probe (x int)")
        conn.execute("INSERT INTO fsync_probe VALUES (0)")
        out = []
        for i in range(samples):
            start = time.perf_counter()
            conn.execute("INSERT INTO fsync_probe VALUES (%s)", (i,))
            out.append(time.perf_counter() - start)
    return out


def _mount(path: str) -> tuple[str, str]:
    """(mount point, file system type) of the mount that holds ``path``."""
    best = ("/", "unknown")
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                _, point, kind, *_ = line.split()
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[0]):
                    best = (point, kind)
    except OSError:
        pass
    return best


def where(directory: str, admin_dsn: str | None) -> str:
    """Where ``directory`` is, and whether PostgreSQL's data is on the same device."""
    point, kind = _mount(directory)
    text = f"{tempfile.gettempdir()} on {point} ({kind})"
    if admin_dsn is None:
        return text
    import psycopg

    try:
        with psycopg.connect(admin_dsn, connect_timeout=5) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        data = str(row[0]) if row else ""
        same = os.stat(data).st_dev == os.stat(directory).st_dev
    except (psycopg.Error, OSError):
        return f"{text}; PostgreSQL's data directory not visible here"
    device = "the same device" if same else "another device"
    return f"{text}; PostgreSQL's data directory {data} on {device}"


def measure(admin_dsn: str | None) -> FsyncReport:
    """All three, in a fresh temporary directory (where the SQLite drains write)."""
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench_fsync_") as tmp:
        place = where(tmp, admin_dsn)
        local = write_fsync(tmp)
        try:
            tool = pg_test_fsync(tmp)
        except (OSError, subprocess.SubprocessError) as exc:
            tool = None
            notes.append(f"pg_test_fsync failed: {exc}")
    commits = None
    if admin_dsn is not None:
        try:
            commits = pg_commit(admin_dsn)
        except Exception as exc:
            notes.append(f"PostgreSQL commit latency failed: {exc}")
    return FsyncReport(local, tool, commits, place, notes)


def main(argv: list[str] | None = None) -> int:
    """Print the three measurements."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args(argv)
    report = measure(args.dsn)
    for key, value in report.lines().items():
        print(f"{key}: {value}")
    for note in report.notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
