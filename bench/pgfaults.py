"""PostgreSQL faults, timed: a read-only database and a partitioned API server.

``python bench/pgfaults.py`` (PostgreSQL at ``$TETHER_TEST_PG``, default
``postgresql://postgres@127.0.0.1:5432/test``) creates a throwaway database per part and
prints what it measured:

1. **Read-only recovery.** A worker runs against the database; the database is made
   read-only (``ALTER DATABASE ... SET default_transaction_read_only = on``) for
   ``--read-only`` seconds, then writable again (``RESET``). Measured: seconds from the
   reset until a job enqueued at the reset has run (claim, heartbeat and completion
   all write), and log lines per second from tether and psycopg during the outage and
   the recovery. Nothing terminates a backend: the worker must recover by itself.
2. **Partition.** The REST API (in process, through httpx) reaches the database through
   a TCP proxy that is put in blackhole mode for ``--partition`` seconds. Measured:
   answer time and status of ``GET /api/jobs``, ``POST /api/jobs`` and ``/health`` during
   the partition, and the time until ``/health`` is green again after the heal.
3. **Outage.** A worker reaches the database through the proxy, which resets every
   connection for ``--outage`` seconds. Measured: log lines per second (psycopg's pool
   apart), and how soon a job enqueued after the heal runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.proxy import FaultProxy
from tether import App, AppConfig, JobContext, WorkerConfig
from tether.web import ApiSettings, create_app

AFTER = 10.0  # seconds after the reset over which log lines are counted (at least)
ADMIN = os.environ.get("TETHER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


class Counter(logging.Handler):
    """Counts log records (with their loop times) from tether and psycopg."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.times: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.INFO and record.name.startswith(("tether", "psycopg")):
            self.times.append((time.monotonic(), f"{record.name}: {record.getMessage()[:100]}"))

    def between(self, a: float, b: float) -> list[str]:
        return [m for t, m in self.times if a <= t < b]


@contextlib.contextmanager
def throwaway_db() -> Iterator[tuple[str, str]]:
    name = f"tether_bench_{secrets.token_hex(5)}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name, urlunsplit(urlsplit(ADMIN)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def alter(name: str, clause: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" {clause}')


def terminate(name: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )


async def read_only(seconds: float, watch: float) -> None:
    counter = Counter()
    root = logging.getLogger()
    root.addHandler(counter)
    root.setLevel(logging.INFO)
    with throwaway_db() as (name, url):
        app = App(url, config=AppConfig(wait_poll_interval=0.05))

        @app.task(name="bench.noop")
        async def noop(ctx: JobContext) -> str:
            return "ok"

        await app.store()
        worker = app.worker(WorkerConfig(concurrency=4))
        runner = asyncio.create_task(worker.run())
        first = await noop.enqueue()
        await app.wait(first.id, timeout=30)
        alter(name, "SET default_transaction_read_only = on")
        # A failover drops every session; the ones opened next are read-only.
        terminate(name)
        t_ro = time.monotonic()
        await asyncio.sleep(seconds)
        alter(name, "RESET default_transaction_read_only")
        t_reset = time.monotonic()
        recovered = None
        job_id = None
        deadline = t_reset + watch
        while time.monotonic() < deadline:
            try:
                if job_id is None:
                    job_id = (await noop.enqueue()).id
                job = await app.get(job_id)
                if job.state.value == "succeeded":
                    recovered = time.monotonic() - t_reset
                    break
            except Exception:
                pass  # the App's own pool may still hold read-only connections
            await asyncio.sleep(0.1)
        # Log lines are counted over the same window after the reset, recovered or not.
        await asyncio.sleep(max(0.0, t_reset + AFTER - time.monotonic()))
        t_end = time.monotonic()
        worker.request_stop()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(runner, 10)
        await app.close()
    root.removeHandler(counter)
    during = counter.between(t_ro, t_reset)
    after = counter.between(t_reset, t_end)
    print(f"read-only for {seconds:.0f}s, then reset; watched {watch:.0f}s after the reset")
    if recovered is None:
        print(f"  recovery: NOT within {watch:.0f}s")
    else:
        print(f"  recovery: a job enqueued at the reset ran {recovered:.2f}s after it")
    print(f"  log lines while read-only: {len(during)} ({len(during) / seconds:.2f}/s)")
    span = max(t_end - t_reset, 1e-9)
    print(f"  log lines after the reset: {len(after)} ({len(after) / span:.2f}/s over {span:.1f}s)")
    kinds: dict[str, int] = {}
    for m in during + after:
        key = m.split(":")[0] + ": " + m.split(": ", 1)[1][:40]
        kinds[key] = kinds.get(key, 0) + 1
    for key, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {n:5d}  {key}")
    for t, m in counter.times:
        if t >= t_reset and ("recovered" in m or "healthy again" in m):
            print(f"  +{t - t_reset:5.2f}s  {m}")


@contextlib.asynccontextmanager
async def api_through(proxy_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = App(proxy_url, config=AppConfig(wait_poll_interval=0.05))

    @app.task(name="bench.noop")
    async def noop(ctx: JobContext) -> str:
        return "ok"

    api = create_app(app, ApiSettings(allow_anonymous=True))
    async with (
        api.router.lifespan_context(api),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://t") as http,
    ):
        yield http


async def timed(http: httpx.AsyncClient, method: str, path: str, **kw: object) -> str:
    t = time.monotonic()
    try:
        res = await http.request(method, path, timeout=120, **kw)  # type: ignore[arg-type]
        code = f"{res.status_code} {res.json().get('code', res.json().get('status', ''))}"
    except Exception as exc:
        code = type(exc).__name__
    return f"{method} {path}: {time.monotonic() - t:.2f}s -> {code}"


async def partition(seconds: float) -> None:
    counter = Counter()
    root = logging.getLogger()
    root.addHandler(counter)
    root.setLevel(logging.INFO)
    try:
        await _partition(seconds, counter)
    finally:
        root.removeHandler(counter)


async def _partition(seconds: float, counter: Counter) -> None:
    with throwaway_db() as (_, url):
        parts = urlsplit(url)
        proxy = FaultProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        port = proxy.start()
        proxy_url = urlunsplit(parts._replace(netloc=f"postgres@127.0.0.1:{port}"))
        try:
            async with api_through(proxy_url) as http:
                # Warm the pool: these connections are open when the partition starts.
                for _ in range(3):
                    await http.get("/api/jobs")
                    await http.post("/api/jobs", json={"task": "bench.noop"})
                proxy.blackhole()
                t0 = time.monotonic()
                print(f"partition of {seconds:.0f}s")
                loop = asyncio.get_running_loop()
                healer = loop.call_later(seconds, proxy.heal)
                results = await asyncio.gather(
                    timed(http, "GET", "/api/jobs"),
                    timed(http, "POST", "/api/jobs", json={"task": "bench.noop"}),
                    timed(http, "GET", "/health"),
                )
                for r in results:
                    print(f"  {r}")
                await asyncio.sleep(max(0.0, seconds - (time.monotonic() - t0)))
                healer.cancel()
                proxy.heal()
                t_heal = t0 + seconds
                green = None
                while time.monotonic() - t_heal < 60:
                    res = await http.get("/health", timeout=30)
                    if res.status_code == 200:
                        green = time.monotonic() - t_heal
                        break
                    await asyncio.sleep(0.2)
                lines = counter.between(t0, t_heal)
                print(
                    f"  log lines during the partition: {len(lines)} ({len(lines) / seconds:.2f}/s)"
                )
                print(
                    f"  /health green {green:.2f}s after the heal"
                    if green is not None
                    else "  /health not green within 60s of the heal"
                )
        finally:
            proxy.stop()


async def outage(seconds: float) -> None:
    """A worker whose database refuses every connection (reset) for ``seconds``."""
    counter = Counter()
    root = logging.getLogger()
    root.addHandler(counter)
    root.setLevel(logging.INFO)
    with throwaway_db() as (_, url):
        await App(url).admin.migrate()
        parts = urlsplit(url)
        proxy = FaultProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        port = proxy.start()
        app = App(urlunsplit(parts._replace(netloc=f"postgres@127.0.0.1:{port}")))

        @app.task(name="bench.noop")
        async def noop(ctx: JobContext) -> str:
            return "ok"

        try:
            worker = app.worker(WorkerConfig(concurrency=4))
            runner = asyncio.create_task(worker.run())
            await app.wait((await noop.enqueue()).id, timeout=30)
            proxy.reset()
            t0 = time.monotonic()
            await asyncio.sleep(seconds)
            proxy.heal()
            t_heal = time.monotonic()
            recovered = None
            while time.monotonic() - t_heal < 60:
                with contextlib.suppress(Exception):
                    job = await noop.enqueue()
                    await app.wait(job.id, timeout=2)
                    recovered = time.monotonic() - t_heal
                    break
                await asyncio.sleep(0.1)
            worker.request_stop()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(runner, 10)
        finally:
            await app.close()
            proxy.stop()
            root.removeHandler(counter)
    lines = counter.between(t0, t_heal)
    pool = [m for m in lines if m.startswith("psycopg.pool")]
    print(f"database refusing connections for {seconds:.0f}s (a worker running)")
    print(
        f"  log lines: {len(lines)} ({len(lines) / seconds:.2f}/s), of which psycopg.pool "
        f"{len(pool)} ({len(pool) / seconds:.2f}/s)"
    )
    print(
        f"  recovery: a job enqueued after the heal ran {recovered:.2f}s after it"
        if recovered is not None
        else "  recovery: NOT within 60s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--read-only", type=float, default=20.0, help="seconds read-only")
    parser.add_argument("--watch", type=float, default=60.0, help="seconds watched after")
    parser.add_argument("--partition", type=float, default=20.0, help="seconds partitioned")
    parser.add_argument("--outage", type=float, default=30.0, help="seconds refusing")
    parser.add_argument(
        "--only", choices=["read-only", "partition", "outage"], help="one part only"
    )
    args = parser.parse_args()
    if args.only in (None, "read-only"):
        asyncio.run(read_only(args.read_only, args.watch))
    if args.only in (None, "partition"):
        asyncio.run(partition(args.partition))
    if args.only in (None, "outage"):
        asyncio.run(outage(args.outage))


if __name__ == "__main__":
    main()
