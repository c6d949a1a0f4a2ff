"""Fixtures for the conformance suite; the helpers live in ``support.py``.

PostgreSQL isolation. ``CREATE DATABASE`` plus running every migration costs 0.3-0.6 s
per test on a busy machine, which alone would take the suite past its time budget. So
the session creates one database and migrates one schema in it once; before each test
every table of that schema is emptied (all but ``tether_migrations`` and
``tether_transitions``, which the migrations write), and the test gets a URL whose
``search_path`` names only that schema. Each test therefore starts from an empty,
fully migrated database, as the ``store`` fixture promises. The migration tests, which
need a database nothing has touched, get a fresh, empty schema each (``pg_fresh_url``).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest

from tether.store import Store, create_store

from .support import Db, empty_tables


def _schema_url(db_url: str, schema: str) -> str:
    """``db_url`` with only ``schema`` on its search_path."""
    query = "options=" + quote(f"-csearch_path={schema}")
    return urlunsplit(urlsplit(db_url)._replace(query=query))


async def _migrate(url: str) -> None:
    s = create_store(url)
    try:
        await s.migrate()
    finally:
        await s.close()


@pytest.fixture(scope="session")
def pg_conformance_db(pg_admin_url: str) -> Iterator[str]:
    """One database for the session's PostgreSQL conformance tests."""
    name = f"tether_conf_{secrets.token_hex(6)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield urlunsplit(urlsplit(pg_admin_url)._replace(path=f"/{name}"))
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_migrated_url(pg_conformance_db: str) -> str:
    """A schema migrated once for the session."""
    with psycopg.connect(pg_conformance_db, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "migrated"')
    url = _schema_url(pg_conformance_db, "migrated")
    asyncio.run(_migrate(url))
    return url


@pytest.fixture
def pg_url(pg_migrated_url: str) -> str:
    """The session's migrated schema, emptied for this test."""
    empty_tables(pg_migrated_url)
    return pg_migrated_url


@pytest.fixture
def pg_fresh_url(pg_conformance_db: str) -> Iterator[str]:
    """A fresh, empty schema that no migration has touched."""
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(pg_conformance_db, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    yield _schema_url(pg_conformance_db, schema)
    with psycopg.connect(pg_conformance_db, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def db(db_url: str) -> Iterator[Db]:
    """Direct SQL on the same database as ``store``."""
    conn = Db(db_url)
    yield conn
    conn.close()


@pytest.fixture
async def make_store(db_url: str) -> AsyncIterator[Callable[[], Store]]:
    """Build more store instances on the same database; all are closed afterwards."""
    made: list[Store] = []

    def build() -> Store:
        s = create_store(db_url)
        made.append(s)
        return s

    yield build
    for s in made:
        await s.close()
