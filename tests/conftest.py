"""Shared fixtures: a real SQLite file and a real PostgreSQL database for every test.

PostgreSQL tests use a fresh database each (created from ``TETHER_TEST_PG``'s server).
They skip when the server is unreachable, except under ``CI=true``, where they fail:
CI must never pass by skipping them.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.pgcluster import PrivateCluster, make_cluster
from tether import App, AppConfig
from tether.store import Store, create_store

PG_ADMIN_URL = os.environ.get("TETHER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under ``CI=true`` a skipped test fails, whatever skipped it (a missing tool, an
    unreachable server, a platform check): CI must never pass by not running something.
    ``.ci/run`` installs what the tests need."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where nothing may skip: {reason}"


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """The maintenance database URL; skips (or fails in CI) if PostgreSQL is down."""
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=5):
            pass
    except psycopg.Error as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL is required in CI but unreachable: {exc}")
        pytest.skip(f"PostgreSQL unreachable: {exc}")
    return PG_ADMIN_URL


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test."""
    name = f"tether_t_{secrets.token_hex(6)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _with_db(pg_admin_url, name)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def private_pg() -> Iterator[PrivateCluster]:
    """A throwaway PostgreSQL cluster of this test session's own, for tests that stop or
    restart the server (never the shared one); removed at the end of the session."""
    cluster = make_cluster()
    if cluster is None:
        if IN_CI:
            pytest.fail("CI needs PostgreSQL's initdb and pg_ctl for a private cluster")
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed")
    yield cluster
    cluster.destroy()


@pytest.fixture
def private_pg_url(private_pg: PrivateCluster) -> Iterator[str]:
    """A fresh database on the private cluster, for one test that may stop the server."""
    private_pg.ensure_started()
    name = f"tether_p_{secrets.token_hex(6)}"
    with psycopg.connect(private_pg.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _with_db(private_pg.admin_url, name)
    private_pg.ensure_started()
    with psycopg.connect(private_pg.admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    """A fresh SQLite file for one test."""
    return f"sqlite:///{tmp_path}/tether.db"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test that uses this runs once per store."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """An open, migrated store on a fresh database."""
    s = create_store(db_url)
    await s.open()
    await s.migrate()
    yield s
    await s.close()


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[App]:
    """An App on a fresh database; waits poll fast so tests stay quick."""
    a = App(db_url, config=AppConfig(wait_poll_interval=0.05))
    yield a
    await a.close()
