"""Migrations: applied once, versioned, safe when several processes start together."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tether.store import Store
from tether.store.base import load_migrations

from .support import new_job


@pytest.fixture
def pg_url(pg_fresh_url: str) -> str:
    """Migration tests start from a schema no migration has touched."""
    return pg_fresh_url


def shipped(store: Store) -> list[int]:
    dialect = "sqlite" if store.url.startswith("sqlite") else "postgres"
    return [m.version for m in load_migrations(dialect)]


async def test_fresh_database_has_schema_version_zero(make_store: Callable[[], Store]) -> None:
    s = make_store()
    await s.open()
    assert await s.schema_version() == 0


async def test_migrate_applies_every_shipped_migration_once(
    make_store: Callable[[], Store],
) -> None:
    s = make_store()
    await s.open()
    versions = shipped(s)
    assert versions and versions == sorted(versions)
    assert await s.migrate() == versions
    assert await s.schema_version() == versions[-1]
    assert await s.migrate() == []
    assert await s.schema_version() == versions[-1]


async def test_migrate_again_keeps_the_data(make_store: Callable[[], Store]) -> None:
    s = make_store()
    await s.open()
    await s.migrate()
    [job] = await s.enqueue([new_job(args={"keep": 1})])
    other = make_store()
    await other.open()
    assert await other.migrate() == []
    assert await other.get(job.id) == job
    assert len(await other.events(job.id)) == 1


async def test_concurrent_migrations_apply_once(make_store: Callable[[], Store]) -> None:
    stores = [make_store() for _ in range(4)]
    for s in stores:
        await s.open()
    results = await asyncio.gather(*(s.migrate() for s in stores))
    versions = shipped(stores[0])
    assert sorted(results, key=len) == [[], [], [], versions]
    for s in stores:
        assert await s.schema_version() == versions[-1]
    jobs = await stores[1].enqueue([new_job()])
    assert (await stores[2].get(jobs[0].id)) == jobs[0]
