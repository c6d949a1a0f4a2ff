"""PostgreSQL faults a worker and the API survive by themselves: a database that was
read-only for a while, a partition between the API and the database, a slow but healthy
statement. Each test uses a throwaway database of its own; the read-only ones, which
change a database setting and end sessions, use the private cluster of the test session,
never the shared server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

import tether
from tests.faults.proxy import FaultProxy
from tests.helpers import eventually, fast_config
from tests.pgcluster import PrivateCluster
from tether import App, AppConfig, JobState, StoreConfig, Worker
from tether.errors import StoreError
from tether.web import ApiSettings, create_app

pytestmark = pytest.mark.postgres


def _db_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


async def _admin_sql(admin_url: str, statement: str) -> None:
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(statement)


@asynccontextmanager
async def read_only(url: str, admin_url: str) -> AsyncIterator[None]:
    """The test's own database is read-only inside the block.

    A failover to a standby drops every session, and the sessions opened next are
    read-only: ending this database's sessions once, at the start, is that fault (not
    a cure: nothing ends them after the database is writable again).
    """
    name = _db_name(url)
    await _admin_sql(admin_url, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    await _admin_sql(
        admin_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()",
    )
    try:
        yield
    finally:
        await _admin_sql(admin_url, f'ALTER DATABASE "{name}" RESET default_transaction_read_only')


async def _tries(round_: Callable[[], Awaitable[object]], attempts: int) -> bool:
    """Whether one of ``attempts`` calls of ``round_`` succeeds."""
    for _ in range(attempts):
        try:
            await round_()
        except StoreError:
            continue
        return True
    return False


async def test_worker_recovers_by_itself_once_a_read_only_database_is_writable(
    private_pg_url: str, private_pg: PrivateCluster
) -> None:
    pg_url, pg_admin_url = private_pg_url, private_pg.admin_url
    app = App(pg_url, config=AppConfig(wait_poll_interval=0.05))

    @app.task
    async def noop(ctx: tether.JobContext) -> str:
        return "done"

    worker = Worker(app, fast_config())
    await worker.start(services=False)
    try:
        async with read_only(pg_url, pg_admin_url):
            # Every write fails while the database is read-only, and every connection
            # the pool opens meanwhile is a read-only session.
            for _ in range(3):
                with pytest.raises(StoreError):
                    await worker.heartbeater.run_once()
            assert not await _tries(worker.claimer.run_once, 2)
        # Writable again: a failed call discards its read-only connection (and the ones
        # opened with it), so the loops recover within a couple of rounds.
        assert await _tries(worker.heartbeater.run_once, 3), "heartbeat never recovered"
        job = await noop.enqueue()
        assert await _tries(worker.claimer.run_once, 3), "claimer never recovered"
        done = await app.wait(job.id, timeout=10)
        assert done.state is JobState.SUCCEEDED
    finally:
        await worker.stop()
        await app.close()


@contextmanager
def captured(logger: str) -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    target = logging.getLogger(logger)
    target.addHandler(handler)
    try:
        yield records
    finally:
        target.removeHandler(handler)


async def test_listen_loop_backs_off_while_a_read_only_database_refuses_it(
    private_pg_url: str, private_pg: PrivateCluster
) -> None:
    pg_url, pg_admin_url = private_pg_url, private_pg.admin_url
    app = App(pg_url, config=AppConfig(wait_poll_interval=0.05))

    @app.task
    async def noop(ctx: tether.JobContext) -> None:
        return None

    worker = Worker(app, fast_config())
    await worker.start(services=False)
    try:
        with captured("tether.store") as records:
            async with read_only(pg_url, pg_admin_url):
                # The LISTEN connection comes back, but it cannot record its session on
                # the worker's row; it keeps trying, ever more slowly, and says so once.
                await asyncio.sleep(3.0)
        lines = [r for r in records if "LISTEN" in r.getMessage()]
        assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]
    finally:
        await worker.stop()
        await app.close()


@asynccontextmanager
async def proxied(url: str) -> AsyncIterator[tuple[FaultProxy, str]]:
    parts = urlsplit(url)
    proxy = FaultProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    port = proxy.start()
    netloc = f"{parts.username or 'postgres'}@127.0.0.1:{port}"
    try:
        yield proxy, urlunsplit(parts._replace(netloc=netloc))
    finally:
        proxy.stop()


async def test_api_answers_503_during_a_partition_and_health_recovers(pg_url: str) -> None:
    await App(pg_url).admin.migrate()
    async with proxied(pg_url) as (proxy, url):
        app = App(url, config=AppConfig(wait_poll_interval=0.05))

        @app.task
        async def noop(ctx: tether.JobContext) -> None:
            return None

        api = create_app(app, ApiSettings(allow_anonymous=True))
        transport = httpx.ASGITransport(app=api)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                # Connections open and idle in the pool when the partition starts.
                assert (await http.get("/api/jobs")).status_code == 200
                assert (await http.get("/health")).json()["database"]["reachable"]
                proxy.blackhole()
                # Should a request hang, the partition heals after a while and the
                # request answers as if nothing happened: the test fails, not hangs.
                healer = asyncio.get_running_loop().call_later(30, proxy.heal)
                try:
                    listing, posted, health = await asyncio.gather(
                        http.get("/api/jobs", timeout=60),
                        http.post("/api/jobs", json={"task": noop.name}, timeout=60),
                        http.get("/health", timeout=60),
                    )
                finally:
                    healer.cancel()
                    proxy.heal()
                for res in (listing, posted):
                    assert res.status_code == 503, res.text
                    assert res.json()["code"] == "store_unavailable"
                assert health.status_code == 503
                assert health.json()["status"] == "down"

                async def green() -> bool:
                    return (await http.get("/health")).status_code == 200

                await eventually(green, timeout=30, every=0.2)
                assert (await http.get("/api/jobs")).status_code == 200
        finally:
            await app.close()


async def test_worker_statements_fail_instead_of_hanging_during_a_partition(
    pg_url: str,
) -> None:
    await App(pg_url).admin.migrate()
    async with proxied(pg_url) as (proxy, url):
        app = App(url, config=AppConfig(wait_poll_interval=0.05))

        @app.task
        async def noop(ctx: tether.JobContext) -> None:
            return None

        worker = Worker(app, fast_config())
        await worker.start(services=False)
        try:
            await worker.claimer.run_once()  # a connection open and idle in the pool
            proxy.blackhole()
            # Should the claim hang, the partition heals after a while and the claim
            # succeeds: the test fails, not hangs.
            healer = asyncio.get_running_loop().call_later(30, proxy.heal)
            try:
                with pytest.raises(StoreError):
                    await worker.claimer.run_once()
            finally:
                healer.cancel()
                proxy.heal()
            assert await _tries(worker.claimer.run_once, 3), "claimer never recovered"
        finally:
            await worker.stop()
            await app.close()


async def test_a_slow_statement_on_a_healthy_database_is_left_to_finish(pg_url: str) -> None:
    # The server says the call's session is busy (it waits on a lock), so the store
    # keeps waiting past answer_timeout instead of abandoning the call.
    config = AppConfig(store=StoreConfig(answer_timeout=0.3))
    app = App(pg_url, config=config)

    @app.task
    async def noop(ctx: tether.JobContext) -> None:
        return None

    job = await noop.enqueue()
    try:
        async with await psycopg.AsyncConnection.connect(pg_url) as locker:
            await locker.execute("SELECT 1 FROM tether_jobs WHERE id = %s FOR UPDATE", (job.id,))
            pausing = asyncio.ensure_future(app.jobs.pause(job.id))
            await asyncio.sleep(1.0)  # several answer_timeouts
            assert not pausing.done()
            await locker.rollback()
        paused = await pausing
        assert paused.state is JobState.PAUSED
    finally:
        await app.close()
