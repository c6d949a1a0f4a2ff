"""tether behind PgBouncer in transaction mode: ``?pgbouncer=true`` turns server-side
prepared statements off, LISTEN and the liveness session go to ``listen_url`` directly,
and a pooled worker is judged by its heartbeat, not by a backend pid that names the
pooler's connection. Each test starts a private PgBouncer in front of its own fresh
database; they skip when ``pgbouncer`` is not installed (CI installs it)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from urllib.parse import urlencode

import psycopg
import pytest
from typer.testing import CliRunner

import tether
from tests.conftest import IN_CI
from tests.helpers import eventually, fast_config
from tests.pgbouncer import PgBouncer, binary
from tether import App, JobState, Worker
from tether import hints as h
from tether.cli import cli
from tether.procinfo import process_gone
from tether.store import create_store
from tether.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres


@pytest.fixture
def pooler(pg_url: str) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of ``pg_url``'s database, with fewer
    server connections than it has clients, so transactions hop between them."""
    exe = binary()
    if exe is None:
        if IN_CI:
            pytest.fail("CI installs pgbouncer: the pooler tests must run there")
        pytest.skip("pgbouncer is not installed")
    bouncer = PgBouncer(exe, pg_url, server_pool=3)
    bouncer.start()
    yield bouncer
    bouncer.stop()


def through(bouncer: PgBouncer, direct: str | None) -> str:
    """``bouncer``'s URL in PgBouncer mode, listening on ``direct`` if given."""
    query = {"pgbouncer": "true", **({"listen_url": direct} if direct else {})}
    return f"{bouncer.url}?{urlencode(query)}"


async def test_migrate_workers_and_enqueues_run_through_a_transaction_mode_pooler(
    pooler: PgBouncer, pg_url: str
) -> None:
    url = through(pooler, pg_url)
    # The command runs its own event loop: off this one.
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["migrate", "--database", url])
    assert result.exit_code == 0, result.output + pooler.log()
    assert "applied migrations" in result.output

    apps = [App(url) for _ in range(3)]
    for app in apps:

        @app.task(name="double")
        async def double(ctx: tether.JobContext, n: int) -> int:
            return 2 * n

    workers = [Worker(app, fast_config(concurrency=4)) for app in apps[:2]]
    producer = apps[2]
    for worker in workers:
        await worker.start()
    try:
        # Many small transactions from five clients over three server connections: a
        # statement prepared on one server connection would be missing (or already
        # exist) on the next.
        jobs = [await producer.enqueue("double", {"n": n}) for n in range(40)]
        done = [await producer.wait(j.id, timeout=30) for j in jobs]
        assert [d.state for d in done] == [JobState.SUCCEEDED] * 40
        assert [d.result for d in done] == [2 * n for n in range(40)]
        with psycopg.connect(pg_url) as conn:
            (ran,) = conn.execute(
                "SELECT count(DISTINCT worker_id) FROM tether_jobs WHERE state = 'succeeded'"
            ).fetchone() or (0,)
        assert ran >= 1
    finally:
        for worker in workers:
            await worker.stop()
        for app in apps:
            await app.close()


async def test_notifications_sent_through_the_pooler_arrive_on_the_listen_url(
    pooler: PgBouncer, pg_url: str
) -> None:
    url = through(pooler, pg_url)
    listener = create_store(url)
    producer = App(url)

    @producer.task(name="send")
    async def send(ctx: tether.JobContext) -> None:
        return None

    assert isinstance(listener, PostgresStore)
    try:
        await listener.migrate()
        with listener.hints.subscribe(h.ENQUEUED, ["mail"]) as sub:
            await listener.listen()

            async def heard() -> bool:
                # The first enqueues may come before the LISTEN: hints are hints.
                await producer.enqueue("send", {}, queue="mail")
                return await sub.get(0.2) == {"mail"}

            await eventually(heard)
        # It listened on a session of the server itself: PgBouncer hands its clients
        # made-up backend pids, which name no server session.
        with psycopg.connect(pg_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (listener._backend_pid,)
            ).fetchone()
        assert row == (1,)
    finally:
        await producer.close()
        await listener.close()


async def test_a_pooled_worker_is_not_judged_by_a_backend_pid(
    pooler: PgBouncer, pg_url: str
) -> None:
    apps = {"direct": App(through(pooler, pg_url)), "pooled": App(through(pooler, None))}
    for app in apps.values():

        @app.task(name="noop")
        async def noop(ctx: tether.JobContext) -> None:
            return None

    workers = {name: Worker(app, fast_config()) for name, app in apps.items()}
    try:
        for worker in workers.values():
            await worker.start(services=False)
        with psycopg.connect(pg_url) as conn:
            rows = dict(
                conn.execute(
                    "SELECT w.id, a.pid FROM tether_workers w "
                    "LEFT JOIN pg_stat_activity a ON a.pid = w.backend_pid"
                ).fetchall()
            )
            # Its listen_url session, which ends when it dies, names the direct worker;
            # the pooled one has none and is judged by its heartbeat and leases.
            assert rows[workers["direct"].id] is not None
            assert rows[workers["pooled"].id] is None
            conn.execute("UPDATE tether_workers SET heartbeat_at = now() - interval '1 min'")
            conn.commit()
        store = await apps["pooled"].store()
        # Both processes are alive: neither may be presumed dead for its session.
        assert await store.mark_dead_workers(process_gone, 1.0) == []
    finally:
        for worker in workers.values():
            await worker.stop()
        for app in apps.values():
            await app.close()


def test_a_pooled_store_never_prepares_statements_and_leaves_options_out() -> None:
    store = create_store("postgresql://h:6432/db?pgbouncer=true&listen_url=postgresql%3A//h/db")
    plain = create_store("postgresql://h/db")
    assert isinstance(store, PostgresStore) and isinstance(plain, PostgresStore)
    assert store._connect_kwargs["prepare_threshold"] is None
    assert "options" not in store._connect_kwargs  # PgBouncer refuses that parameter
    assert store._listen_dsn == "postgresql://h/db"
    assert "prepare_threshold" not in plain._connect_kwargs
    assert plain._listen_dsn == plain._dsn


async def test_a_pooled_store_without_a_listen_url_polls_instead_of_listening() -> None:
    store = create_store("postgresql://h:6432/db?pgbouncer=1")
    assert isinstance(store, PostgresStore)
    await store.listen()  # no connection is attempted: nothing to wait for
    assert store._listener is None
    await asyncio.sleep(0)
