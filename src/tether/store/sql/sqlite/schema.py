"""Migrations (see :mod:`tether.store.common.schema`)."""

import sqlite3

from tether.store.sql.sqlite.fragments import NOW

#: The folder of :func:`tether.store.base.load_migrations`.
MIGRATIONS = "sqlite"
# A row only if the table exists.
HAS_MIGRATIONS = "SELECT 1 AS t FROM sqlite_master WHERE type='table' AND name='tether_migrations'"
SCHEMA_VERSION = "SELECT COALESCE(MAX(version), 0) AS v FROM tether_migrations"
APPLIED = "SELECT version FROM tether_migrations"
# Nothing to take first: the write transaction (BEGIN IMMEDIATE) admits one migrator.
MIGRATE_BEGIN: tuple[str, ...] = ()
CREATE_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS tether_migrations "
    "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
)
RECORD_MIGRATION = f"INSERT INTO tether_migrations VALUES (:version, :name, {NOW})"
# A migration a release recorded under another number (RENUMBERED, common/schema.py).
RENUMBER_MIGRATION = (
    "UPDATE tether_migrations SET version = :new_version, name = :new_name "
    "WHERE version = :old_version AND name = :old_name"
)


def statements(script: str) -> list[str]:
    """A migration's statements, to run one by one (executescript would COMMIT our
    transaction), keeping trigger bodies whole."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--") and not buf.strip():
            continue
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out
