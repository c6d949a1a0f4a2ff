"""Migrations: applied once, versioned, safe when several processes start together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from tether import App, AppConfig, SchemaVersionError
from tether.states import transition_pairs
from tether.store import Store, base
from tether.store.base import load_migrations
from tether.store.common import schema as schema_sql

from .support import Db, new_job


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


# -- the rules belong to migrations; the schema version is checked at start ------------


async def test_the_migrated_transition_table_equals_the_states_module(
    make_store: Callable[[], Store], db: Db
) -> None:
    s = make_store()
    await s.migrate()
    rows = db.execute("SELECT from_state, to_state FROM tether_transitions")
    assert sorted(tuple(r) for r in rows) == transition_pairs()


async def test_starting_a_process_does_not_rewrite_the_transition_rules(
    make_store: Callable[[], Store], db: Db
) -> None:
    # A newer release's migration allowed one more transition; an older process that
    # starts afterwards (a rolling deploy) must not take it away again.
    await make_store().migrate()
    db.execute("INSERT INTO tether_transitions VALUES ('succeeded', 'queued')")
    app = App(db.url)
    try:
        await app.store()
        assert await app.admin.migrate() == []
    finally:
        await app.close()
    assert await make_store().migrate() == []
    rows = db.execute("SELECT from_state, to_state FROM tether_transitions")
    assert ("succeeded", "queued") in {tuple(r) for r in rows}


async def test_a_process_that_may_not_migrate_refuses_an_unmigrated_database(
    db: Db,
) -> None:
    app = App(db.url, config=AppConfig(auto_migrate=False))
    with pytest.raises(SchemaVersionError, match="tether migrate"):
        await app.store()
    with pytest.raises(SchemaVersionError):
        await app.get(1)
    await app.close()


async def test_a_process_that_may_not_migrate_refuses_a_database_behind_its_code(
    make_store: Callable[[], Store], db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_store()
    await s.migrate()
    # A newer release of the code: it ships one migration the database has not seen.
    newer = max(shipped(s)) + 1
    extra = base.Migration(newer, f"{newer:04d}_probe.sql", "CREATE TABLE tether_probe (x INT);")
    with_extra = [*load_migrations("sqlite" if db.dialect == "sqlite" else "postgres"), extra]
    for module in (base, schema_sql):
        monkeypatch.setattr(module, "load_migrations", lambda _d: with_extra)
    app = App(db.url, config=AppConfig(auto_migrate=False))
    with pytest.raises(SchemaVersionError, match=rf"migration\(s\) {newer} "):
        await app.store()
    await app.close()
    # With migrating allowed (the default), the same start applies it and goes on.
    app = App(db.url)
    try:
        await app.store()
    finally:
        await app.close()
    assert await s.schema_version() == newer


async def test_a_process_older_than_the_database_schema_warns_and_runs(
    make_store: Callable[[], Store], db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    await make_store().migrate()
    stamp = "0" if db.dialect == "sqlite" else "now()"
    db.execute(f"INSERT INTO tether_migrations VALUES (9999, 'from a newer release', {stamp})")
    for config in (AppConfig(), AppConfig(auto_migrate=False)):
        caplog.clear()
        app = App(db.url, config=config)
        try:
            with caplog.at_level(logging.WARNING, logger="tether.schema"):
                store = await app.store()
            assert await store.enqueue([new_job()])
        finally:
            await app.close()
        assert "9999" in caplog.text and "does not know" in caplog.text


async def test_a_process_whose_migration_fails_refuses_to_start_and_changes_nothing(
    make_store: Callable[[], Store], db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_store()
    await s.migrate()
    before = await s.applied_migrations()
    # This code ships one more migration than the database has, and it cannot apply.
    ship = base.load_migrations

    def with_broken(dialect: str) -> list[base.Migration]:
        broken = base.Migration(9998, "9998_broken.sql", "CREATE TABLE tether_jobs (x INT);")
        return [*ship(dialect), broken]

    for module in (base, schema_sql):
        monkeypatch.setattr(module, "load_migrations", with_broken)
    app = App(db.url)
    with pytest.raises(SchemaVersionError, match=r"cannot apply migration\(s\) 9998 "):
        await app.store()
    await app.close()
    assert await s.applied_migrations() == before
