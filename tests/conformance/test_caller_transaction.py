"""Enqueue inside the caller's own transaction: the job commits or rolls back with it."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from tether import App, AppConfig, InvalidJobError, JobNotFoundError, Workflow
from tether.audit import Audit
from tether.store import parse_sqlite_path

from .support import Db

Caller = Any  # a sqlite3.Connection or a psycopg.AsyncConnection


def _sqlite_caller(url: str) -> sqlite3.Connection:
    # The driver's default mode: a transaction begins at the first write.
    return sqlite3.connect(parse_sqlite_path(url), timeout=5)


@pytest.fixture
async def caller(app: App, db_url: str) -> AsyncIterator[Caller]:
    """The application's own connection, with an ``orders`` table, no transaction open."""
    await app.store()  # migrated
    if db_url.startswith("sqlite"):
        conn = _sqlite_caller(db_url)
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        conn.commit()
        yield conn
        conn.close()
    else:
        aconn = await psycopg.AsyncConnection.connect(db_url)
        await aconn.execute("CREATE TABLE orders (id bigint PRIMARY KEY)")
        await aconn.commit()
        yield aconn
        await aconn.rollback()
        await aconn.execute("DROP TABLE orders")
        await aconn.commit()
        await aconn.close()


async def _execute(conn: Caller, sql: str) -> None:
    if isinstance(conn, sqlite3.Connection):
        conn.execute(sql)
    else:
        await conn.execute(sql)


async def _end(conn: Caller, commit: bool) -> None:
    if isinstance(conn, sqlite3.Connection):
        conn.commit() if commit else conn.rollback()
    else:
        await (conn.commit() if commit else conn.rollback())


def _ship_task(app: App, ran: list[int]) -> Any:
    @app.task(name="ship")
    async def ship(ctx: Any, order: int) -> int:
        ran.append(order)
        return order

    return ship


async def test_commit_gives_one_job_and_one_execution(app: App, caller: Caller) -> None:
    ran: list[int] = []
    ship = _ship_task(app, ran)
    await _execute(caller, "INSERT INTO orders VALUES (7)")
    job = await ship.options(connection=caller).enqueue(order=7)
    with pytest.raises(JobNotFoundError):
        await app.get(job.id)  # not visible before the caller commits
    await _end(caller, commit=True)
    done = await app.run_until_idle()
    assert [(j.id, j.state.value, j.result) for j in done] == [(job.id, "succeeded", 7)]
    assert ran == [7]
    assert len(await app.jobs.list()) == 1


async def test_rollback_leaves_no_job_and_no_execution(app: App, caller: Caller) -> None:
    ran: list[int] = []
    ship = _ship_task(app, ran)
    await _execute(caller, "INSERT INTO orders VALUES (7)")
    job = await ship.options(connection=caller).enqueue(order=7)
    await _end(caller, commit=False)
    assert await app.run_until_idle() == []
    assert ran == []
    assert await app.jobs.list() == []
    with pytest.raises(JobNotFoundError):
        await app.get(job.id)


async def test_enqueue_joins_the_callers_pending_writes_without_waiting_on_them(
    app: App, caller: Caller
) -> None:
    # The caller holds its write lock (SQLite) and the key's lock (PostgreSQL) until it
    # commits; a second connection would wait on either. The caller's own does not.
    ran: list[int] = []
    ship = _ship_task(app, ran)
    await _execute(caller, "INSERT INTO orders VALUES (7)")
    first = await ship.options(connection=caller, idempotency_key="order-7").enqueue(order=7)
    again = await ship.options(connection=caller, idempotency_key="order-7").enqueue(order=7)
    after = await ship.options(connection=caller, depends_on=(first.id,)).enqueue(order=8)
    assert again.id == first.id
    assert after.state.value == "blocked"
    await _end(caller, commit=True)
    assert [j.state.value for j in await app.run_until_idle()] == ["succeeded", "succeeded"]
    assert ran == [7, 8]


async def test_enqueue_many_and_workflows_commit_and_roll_back_with_the_caller(
    app: App, caller: Caller
) -> None:
    ran: list[int] = []
    ship = _ship_task(app, ran)
    flow = Workflow()
    flow.add("a", ship, {"order": 1})
    flow.add("b", ship, {"order": 2}, depends_on=["a"])
    await app.enqueue_many([(ship, {"order": 3}), (ship, {"order": 4})], connection=caller)
    await app.enqueue_workflow(flow, connection=caller)
    await _end(caller, commit=False)
    assert await app.jobs.list() == []
    await app.enqueue_many([(ship, {"order": 3}), (ship, {"order": 4})], connection=caller)
    jobs = await app.enqueue_workflow(flow, connection=caller)
    await _end(caller, commit=True)
    assert len(await app.jobs.list()) == 4
    await app.run_until_idle()
    assert sorted(ran) == [1, 2, 3, 4]
    assert (await app.get(jobs["b"].id)).state.value == "succeeded"


async def test_a_failed_enqueue_leaves_the_callers_transaction_usable(
    app: App, caller: Caller
) -> None:
    ship = _ship_task(app, [])
    await _execute(caller, "INSERT INTO orders VALUES (7)")
    with pytest.raises(InvalidJobError, match="unknown dependency"):
        await ship.options(connection=caller, depends_on=(999_999,)).enqueue(order=7)
    await ship.options(connection=caller).enqueue(order=7)
    await _end(caller, commit=True)
    assert len(await app.jobs.list()) == 1


# -- blocking callers, notifications, refusals ---------------------------------------------


@pytest.fixture
def sync_app(db_url: str) -> Iterator[App]:
    a = App(db_url, config=AppConfig(wait_poll_interval=0.05))
    a.run_sync(a.admin.migrate())
    yield a
    a.run_sync(a.close())


def test_blocking_enqueue_commits_with_the_caller_and_notifies_at_commit(
    sync_app: App, db_url: str, db: Db
) -> None:
    ship = _ship_task(sync_app, [])
    if db_url.startswith("sqlite"):
        conn = _sqlite_caller(db_url)
        version = db.execute("PRAGMA data_version")
        job = ship.options(connection=conn).enqueue_sync(order=1)
        # Another connection's data_version moves at commit only: what a worker watches.
        assert db.execute("PRAGMA data_version") == version
        conn.commit()
        assert db.execute("PRAGMA data_version") != version
        conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url) as pg:
            listener.execute("LISTEN tether_enqueued")
            job = ship.options(connection=pg).enqueue_sync(order=1)
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
            pg.commit()
            [note] = listener.notifies(timeout=10, stop_after=1)
            assert note.payload == "default"
    assert sync_app.get_sync(job.id).state.value == "queued"


def test_a_connection_in_autocommit_mode_is_refused_and_nothing_is_written(
    sync_app: App, db_url: str
) -> None:
    ship = _ship_task(sync_app, [])
    conn: Any
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(parse_sqlite_path(db_url), isolation_level=None)
    else:
        conn = psycopg.connect(db_url, autocommit=True)
    with conn, pytest.raises(InvalidJobError, match="autocommit"):
        ship.options(connection=conn).enqueue_sync(order=1)
    assert sync_app.run_sync(sync_app.jobs.list()) == []


def test_a_connection_to_another_database_is_refused(
    sync_app: App, db_url: str, tmp_path: Any
) -> None:
    ship = _ship_task(sync_app, [])
    conn: Any
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(tmp_path / "other.db")
    else:
        conn = sqlite3.connect(":memory:")  # the wrong kind altogether
    with pytest.raises(InvalidJobError):
        ship.options(connection=conn).enqueue_sync(order=1)
    with pytest.raises(InvalidJobError, match="psycopg 3 connection or a sqlite3"):
        ship.options(connection=object()).enqueue_sync(order=1)
    conn.close()


async def test_the_audit_row_of_an_enqueue_commits_or_rolls_back_with_the_caller(
    app: App, caller: Caller
) -> None:
    ship = _ship_task(app, [])
    await ship.options(connection=caller).enqueue(order=1)
    await _end(caller, commit=False)
    kept = await ship.options(connection=caller).enqueue(order=2)
    await _end(caller, commit=True)
    rows = [r for r in await Audit(app).list() if r.action == "job.enqueue"]
    assert [(r.target, r.result) for r in rows] == [(f"job:{kept.id}", "ok")]


# -- sqlite3's PEP 249 autocommit attribute (Python 3.12+) -----------------------------


class _PepAutocommit(sqlite3.Connection):
    """Where ``sqlite3.Connection`` has no ``autocommit`` attribute (before 3.12), a
    stand-in with what matters of it: ``autocommit=True`` makes ``commit()`` a no-op
    while ``isolation_level`` stays ``""``; ``autocommit=False`` keeps a transaction
    open that ``commit()`` commits."""

    autocommit: bool

    def commit(self) -> None:
        if not self.autocommit:
            super().commit()


def _connect_with_autocommit(path: str, autocommit: bool) -> sqlite3.Connection:
    if sys.version_info >= (3, 12):  # the real attribute
        return sqlite3.connect(path, timeout=1, autocommit=autocommit)
    conn = sqlite3.connect(path, timeout=1, factory=_PepAutocommit)
    conn.autocommit = autocommit  # type: ignore[attr-defined]
    if not autocommit:
        conn.execute("BEGIN")  # as 3.12 does: a transaction is always open
    return conn


@pytest.mark.parametrize("begun", [False, True])
def test_a_sqlite_connection_with_pep249_autocommit_is_refused_and_nothing_is_written(
    sqlite_url: str, begun: bool
) -> None:
    app = App(sqlite_url, config=AppConfig(wait_poll_interval=0.05))
    app.run_sync(app.admin.migrate())
    try:
        ship = _ship_task(app, [])
        conn = _connect_with_autocommit(parse_sqlite_path(sqlite_url), autocommit=True)
        assert conn.isolation_level == ""  # what the old check looked at
        if begun:
            conn.execute("BEGIN")  # still: commit() would not commit it
        with pytest.raises(InvalidJobError, match="autocommit=True"):
            ship.options(connection=conn).enqueue_sync(order=1)
        assert conn.in_transaction is begun  # nothing of tether's left open or written
        conn.close()
        # The database is not held: another writer gets through, and finds no job.
        assert app.run_sync(app.jobs.list()) == []
        job = ship.enqueue_sync(order=2)
        assert [j.id for j in app.run_sync(app.jobs.list())] == [job.id]
    finally:
        app.run_sync(app.close())


def test_a_sqlite_connection_with_autocommit_false_commits_with_the_caller(
    sqlite_url: str,
) -> None:
    app = App(sqlite_url, config=AppConfig(wait_poll_interval=0.05))
    app.run_sync(app.admin.migrate())
    try:
        ship = _ship_task(app, [])
        conn = _connect_with_autocommit(parse_sqlite_path(sqlite_url), autocommit=False)
        job = ship.options(connection=conn).enqueue_sync(order=1)
        conn.commit()
        conn.close()
        listed = app.run_sync(app.jobs.list())
        assert [(j.id, j.state.value) for j in listed] == [(job.id, "queued")]
    finally:
        app.run_sync(app.close())
