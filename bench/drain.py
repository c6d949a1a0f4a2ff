"""A drain: every system's consumers in processes of their own, the end read from the database.

The harness (``bench/run.py``) enqueues a system's ``n`` no-op jobs first, untimed, then
hands :func:`drain` the consumer processes to run (``bench/consumers.py`` command lines)
and a count of the jobs that system has finished, read from its database. :func:`drain`
starts the processes, waits until each has connected and said ``ready``, releases them
all at once (the clock starts) and polls the count until it reaches ``n`` (the clock
stops); then it stops the processes (SIGINT, each library's graceful stop) and returns
the rate and how many jobs the processes say they ran.

Nothing of a consumer runs in the harness's process or event loop, and the end is never
a signal from a consumer: it is the database's count, read on a connection of the
harness's own. The count is polled at a pace set by the drain's own progress (about half
the time the rest of the jobs should take at the rate so far, between :data:`POLL_MIN` and
:data:`POLL_MAX`), so a drain costs some twenty cheap queries and the end is seen within
a few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
CONSUMERS = BENCH_DIR / "consumers.py"

#: A drain that makes no progress for this long has stalled (a broken consumer, say).
STALL_SECONDS = 15.0
#: Time a consumer process gets to start and connect, and to stop.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
POLL_MIN = 0.005
POLL_MAX = 0.5

#: Jobs finished so far, read from the system's database.
Count = Callable[[], Awaitable[int]]


class DrainError(RuntimeError):
    """A drain could not be completed or ended wrong."""


@dataclass(frozen=True)
class Drained:
    """One timed drain."""

    rate: float
    #: Handler calls the consumer processes reported, added up.
    ran: int


@contextlib.asynccontextmanager
async def pg_count(dsn: str, sql: str, params: Sequence[object] = ()) -> AsyncIterator[Count]:
    """A :data:`Count` running ``sql`` (one ``count(*)``) on a PostgreSQL connection."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

        async def count() -> int:
            cur = await conn.execute(sql, params)
            row = await cur.fetchone()
            return int(row[0]) if row is not None else 0

        yield count


@contextlib.asynccontextmanager
async def sqlite_count(path: str, sql: str, of: int | None = None) -> AsyncIterator[Count]:
    """A :data:`Count` running ``sql`` on a SQLite file; with ``of``, ``of`` minus its
    result (for a system that counts what is left rather than what is done)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:

        async def count() -> int:
            got = int(conn.execute(sql).fetchone()[0])
            return got if of is None else of - got

        yield count
    finally:
        conn.close()


def _log_tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no consumer log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty consumer log)"


async def _start(argv: Sequence[str], log: Path) -> asyncio.subprocess.Process:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as logf:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(CONSUMERS),
            *argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=logf,
        )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
    except TimeoutError:
        line = b""
    if line.strip() != b"ready":
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise DrainError(f"consumer {' '.join(argv[:1])} did not start:\n{_log_tail(log)}")
    return proc


async def _stop(proc: asyncio.subprocess.Process, log: Path) -> int:
    """Stop a consumer gracefully; the number of jobs it says it ran."""
    assert proc.stdout is not None
    if proc.returncode is None:
        proc.send_signal(signal.SIGINT)
    try:
        out = await asyncio.wait_for(proc.stdout.read(), STOP_TIMEOUT)
        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise DrainError(
            f"consumer did not stop within {STOP_TIMEOUT:g} s:\n{_log_tail(log)}"
        ) from None
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("ran "):
            return int(line.split()[1])
    raise DrainError(f"consumer exited {proc.returncode} without its count:\n{_log_tail(log)}")


async def _until_finished(
    count: Count, n: int, start: float, time_limit: float, alive: Callable[[], str | None]
) -> float:
    """Poll ``count`` until it reaches ``n``; the reading taken just before that query."""
    last, last_change = -1, start
    while True:
        now = time.perf_counter()
        done = await count()
        if done >= n:
            return now
        dead = alive()
        if dead is not None:
            raise DrainError(f"a consumer exited during the drain ({done}/{n} done):\n{dead}")
        if done != last:
            last, last_change = done, now
        elif now - last_change > STALL_SECONDS:
            raise DrainError(f"stalled at {done}/{n} for {STALL_SECONDS:g} s")
        if now - start > time_limit:
            raise DrainError(f"{done}/{n} after {time_limit:g} s")
        rate = done / (now - start) if done > 0 else 0.0
        left = (n - done) / rate if rate > 0 else POLL_MIN * 10
        await asyncio.sleep(min(POLL_MAX, max(POLL_MIN, left / 2)))


async def drain(
    commands: Sequence[Sequence[str]], n: int, count: Count, workdir: Path, time_limit: float
) -> Drained:
    """Run ``commands`` (``bench/consumers.py`` arguments, one process each) until
    ``count()`` reaches ``n``; the clock runs from their release until then."""
    logs = [workdir / f"consumer{i}.log" for i in range(len(commands))]
    procs: list[asyncio.subprocess.Process] = []
    try:
        for argv, log in zip(commands, logs, strict=True):
            procs.append(await _start(argv, log))

        def alive() -> str | None:
            for proc, log in zip(procs, logs, strict=True):
                if proc.returncode is not None:
                    return _log_tail(log)
            return None

        start = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
        await asyncio.gather(*(p.stdin.drain() for p in procs if p.stdin is not None))
        end = await _until_finished(count, n, start, time_limit, alive)
        ran = 0
        for proc, log in zip(procs, logs, strict=True):
            ran += await _stop(proc, log)
        return Drained(n / (end - start), ran)
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
