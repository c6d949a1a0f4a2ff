"""An upgrade from the previous release: a database that release 0.1's migrations built
and that holds rows of every table is migrated by this code, keeps every row, and works.

Release 0.1's migrations are this code's own files, less those added since (a shipped
migration is never edited), with SQLite's partial-cancellation index under the name 0.1
gave it; its rows, written by hand against its schema, are in
``tests/fixtures/release_0_1/data``. The test needs no git history.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tether import App
from tether.job import JobFilter, Outcome
from tether.states import JobState
from tether.store import parse_sqlite_path
from tether.store.base import load_migrations, migration_version
from tether.store.common.schema import RENUMBERED

from .support import Db, new_job

RELEASE = Path(__file__).parents[1] / "fixtures" / "release_0_1"
SHIPPED = Path(__file__).parents[2] / "src" / "tether" / "store" / "migrations"
# The newest migration of release 0.1, and the comment-only files added since under older
# numbers (each dialect's versions made equal).
RELEASE_LAST = 26
ADDED_SINCE = {
    "sqlite": {
        "0005_planned_triggers.sql",
        "0022_paced_claim_by_priority.sql",
        "0024_concurrent_releases.sql",
    },
    "postgres": {"0014_bulk_batches.sql"},
}


def release_0_1_migrations(dialect: str) -> list[tuple[str, Path]]:
    """Release 0.1's migrations of ``dialect``: (the name it recorded, the file)."""
    old_name = {new: old for old, new in RENUMBERED.get(dialect, ())}
    return sorted(
        (old_name.get(f.name, f.name), f)
        for f in (SHIPPED / dialect).glob("*.sql")
        if migration_version(f.name) <= RELEASE_LAST and f.name not in ADDED_SINCE[dialect]
    )


# Release 0.1's migrations table and how its runner recorded a migration.
RELEASE_RUNNER = {
    "sqlite": (
        "CREATE TABLE IF NOT EXISTS tether_migrations "
        "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)",
        "INSERT INTO tether_migrations VALUES (?, ?, (julianday('now') - 2440587.5) * 86400.0)",
    ),
    "postgres": (
        "CREATE TABLE IF NOT EXISTS tether_migrations (version INTEGER PRIMARY KEY, "
        "name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        "INSERT INTO tether_migrations (version, name) VALUES (%s, %s)",
    ),
}

# The jobs of the fixture's rows, by id.
STATES = {
    1: JobState.QUEUED,
    2: JobState.BLOCKED,
    3: JobState.RUNNING,
    4: JobState.RETRYING,
    5: JobState.PAUSED,
    6: JobState.SUCCEEDED,
    7: JobState.FAILED,
    8: JobState.CANCELLED,
}


@pytest.fixture
def pg_url(pg_fresh_url: str) -> str:
    """The release builds its schema from nothing."""
    return pg_fresh_url


def dialect_of(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgres"


def run_script(url: str, script: str, record: tuple[int, str] | None = None) -> None:
    """Run a whole SQL file (and record it as release 0.1's runner did)."""
    create, insert = RELEASE_RUNNER[dialect_of(url)]
    if url.startswith("sqlite"):
        with sqlite3.connect(parse_sqlite_path(url)) as lite:
            lite.executescript(script)
            if record:
                lite.execute(create)
                lite.execute(insert, record)
        lite.close()
        return
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(script.encode())
        if record:
            pg.execute(create)
            pg.execute(insert, record)


def build_release_0_1(url: str) -> list[str]:
    """Migrate an empty database as release 0.1 did, then write its rows; return the
    names of the migrations it recorded."""
    migrations = release_0_1_migrations(dialect_of(url))
    for name, f in migrations:
        run_script(url, f.read_text("utf-8"), (migration_version(name), name))
    run_script(url, (RELEASE / "data" / f"{dialect_of(url)}.sql").read_text("utf-8"))
    return [name for name, _ in migrations]


def snapshot(db: Db) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
    """Every table's columns and rows (in a stable order), but the migrations'."""
    if db.dialect == "sqlite":
        tables = [
            r[0]
            for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'tether%'"
            )
        ]
        columns = {t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")] for t in tables}
    else:
        rows = db.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        )
        columns = {}
        for table, column in rows:
            columns.setdefault(table, []).append(column)
    return {t: (cols, rows_of(db, t, cols)) for t, cols in columns.items()}


def rows_of(db: Db, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    listed = ", ".join(f'"{c}"' for c in columns)
    return sorted(db.execute(f"SELECT {listed} FROM {table}"), key=repr)


async def test_a_release_0_1_database_migrates_and_keeps_every_row(db: Db) -> None:
    recorded = build_release_0_1(db.url)
    before = snapshot(db)
    assert {t for t, (_, rows) in before.items() if not rows} <= {
        "tether_migrations",
        "tether_open_batches",  # SQLite: only while a bulk enqueue is under way
    }
    shipped = load_migrations(dialect_of(db.url))

    app = App(db.url)
    try:
        applied = await app.admin.migrate()
        assert await app.admin.migrate() == []
    finally:
        await app.close()

    # Each migration of the release ran once, under the release; the rest now.
    carried = dict(RENUMBERED.get(dialect_of(db.url), ()))
    names = {m.version: m.name for m in shipped}
    assert {names[v] for v in applied}.isdisjoint(carried.get(n, n) for n in recorded)
    rows = db.execute("SELECT version, name FROM tether_migrations ORDER BY version")
    assert [tuple(r) for r in rows] == [(m.version, m.name) for m in shipped]
    # Every other row, as the release left it (in the columns it had).
    after = {t: (cols, rows_of(db, t, cols)) for t, (cols, _) in before.items()}
    del before["tether_migrations"], after["tether_migrations"]
    assert after == before


async def test_a_release_0_1_database_works_after_the_upgrade(db: Db) -> None:
    build_release_0_1(db.url)
    app = App(db.url)
    try:
        store = await app.store()
        assert await app.admin.schema_version() == app.admin.expected_schema_version()
        assert await app.admin.missing_migrations() == []
        jobs = {job.id: job for job in await store.list_jobs(JobFilter())}
        assert {i: job.state for i, job in jobs.items()} == STATES
        # Counted and listed by state through the indexes the upgrade rebuilt (0027).
        assert await store.count_by_state() == {s.value: 1 for s in STATES.values()}
        for job_id, state in STATES.items():
            assert [j.id for j in await store.list_jobs(JobFilter(states=(state,)))] == [job_id]
        # The release's key still names its job in the key's (now partial) unique index.
        keyed = new_job(task="work", queue="default", idempotency_key="release-0.1:queued")
        assert [j.id for j in await store.enqueue([keyed])] == [1]
        assert [e.to_state for e in await store.events(4)] == [
            JobState.QUEUED,
            JobState.RUNNING,
            JobState.RETRYING,
        ]
        # The release stored every transition: the history (0028) derives none of them
        # again, in any state.
        stored = db.execute("SELECT job_id, COUNT(*) FROM tether_job_events GROUP BY job_id")
        for job_id, n in stored:
            history = await store.events(job_id)
            assert len(history) == n and all(e.id is not None for e in history), job_id
        assert {int(j) for j, _ in stored} == set(STATES)
        assert await store.get_artifact(3, "log.txt") == b"hello"
        partial = await store.list_cancellations(limit=10, offset=0, status="partial")
        assert [c.id for c in partial] == ["cancel-3"]
        assert [s.name for s in await store.list_schedules()] == ["nightly"]
        assert [w.id for w in await store.list_workers()] == ["w-0.1"]

        # Enqueue, claim and finish: the release's queued job first, then the new one;
        # its dependent is released, and the running job's worker still finishes it.
        [fresh] = await store.enqueue([new_job(task="work", queue="default")])
        claimed = await store.claim("w-new", ["default"], ["work"], 10, 60.0)
        assert [j.id for j in claimed] == [1, fresh.id]
        done = [Outcome(j.id, j.lease_token, JobState.SUCCEEDED) for j in claimed]
        running = jobs[3]
        done.append(Outcome(running.id, running.lease_token, JobState.SUCCEEDED))
        await store.finish("w-new", done[:2])
        await store.finish("w-0.1", done[2:])
        for job_id in (1, fresh.id, 3):
            assert (await store.get(job_id)).state is JobState.SUCCEEDED
        assert (await store.get(2)).state is JobState.QUEUED
        [gpu] = [limit for limit in await store.list_limits() if limit.name == "resource:gpu"]
        assert gpu.used == 0
    finally:
        await app.close()
