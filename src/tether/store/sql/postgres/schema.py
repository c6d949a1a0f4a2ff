"""Migrations (see :mod:`tether.store.common.schema`)."""

#: The folder of :func:`tether.store.base.load_migrations`.
MIGRATIONS = "postgres"
_MIGRATE_LOCK = 0x7E7E_0002
# One row, whose ``t`` is NULL while the table is missing.
HAS_MIGRATIONS = "SELECT to_regclass('tether_migrations') AS t"
SCHEMA_VERSION = "SELECT COALESCE(MAX(version), 0) AS v FROM tether_migrations"
APPLIED = "SELECT version FROM tether_migrations"
# Several workers may start at once; one migrates, the others wait and see.
# A migration may take long (an index on a big table): no statement timeout.
MIGRATE_BEGIN = (
    "SET LOCAL statement_timeout = 0",
    f"SELECT pg_advisory_xact_lock({_MIGRATE_LOCK})",
)
CREATE_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS tether_migrations (version INTEGER PRIMARY KEY, "
    "name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
)
RECORD_MIGRATION = "INSERT INTO tether_migrations (version, name) VALUES (%(version)s, %(name)s)"
# A migration a release recorded under another number (RENUMBERED, common/schema.py).
RENUMBER_MIGRATION = (
    "UPDATE tether_migrations SET version = %(new_version)s, name = %(new_name)s "
    "WHERE version = %(old_version)s AND name = %(old_name)s"
)


def statements(script: str) -> list[str]:
    """A migration's statements, to run one by one: the whole text in one execute (sent
    without parameters, it goes as one simple query)."""
    return [script]
