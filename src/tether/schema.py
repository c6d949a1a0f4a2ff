"""Whether the database schema fits this code, checked when a process first connects.

Migrations are versioned and only ever added, each under one number in both dialects,
so two sets decide it: the versions this code ships and the versions recorded in the
database. (One migration of release 0.1 had another number on SQLite; the runner carries
such a record over before applying anything: ``RENUMBERED`` in
:mod:`tether.store.common.schema`.)

- A version the code ships that the database lacks is pending. It is applied on first
  use (``AppConfig.auto_migrate``, the default) or by ``tether migrate``; a process
  that does not apply it refuses to start, since its SQL would meet tables it does
  not expect.
- A version recorded in the database that the code does not know means a newer
  release migrated it, as in a rolling deploy. The older process keeps working (every
  migration stays compatible with the release before it) and warns that it is behind.
"""

from __future__ import annotations

import logging

from tether.errors import SchemaVersionError, StoreError
from tether.store.base import shipped_versions
from tether.store.protocols import SchemaStore

log = logging.getLogger("tether.schema")


async def ensure_schema(store: SchemaStore, *, migrate: bool) -> list[int]:
    """Apply pending migrations if ``migrate``, then check the schema; return what was
    applied. Raises :class:`SchemaVersionError` when migrations this code needs are
    missing, and logs a warning when the database is newer than this code."""
    shipped = shipped_versions(store.url)
    have = await store.applied_migrations()
    applied: list[int] = []
    if migrate and shipped - have:
        try:
            applied = await store.migrate()
        except StoreError as exc:
            raise SchemaVersionError(
                f"cannot apply migration(s) {_join(sorted(shipped - have))} that this version "
                f"of tether needs: {exc}"
            ) from exc
        have = await store.applied_migrations()
    missing = sorted(shipped - have)
    if missing:
        raise SchemaVersionError(
            f"the database schema lacks migration(s) {_join(missing)} that this version of "
            "tether needs; run `tether migrate` (or enable AppConfig.auto_migrate) first"
        )
    unknown = sorted(have - shipped)
    if unknown:
        log.warning(
            "the database has migration(s) %s that this version of tether does not know: "
            "a newer release migrated it; upgrade this process",
            _join(unknown),
        )
    return applied


def _join(versions: list[int]) -> str:
    return ", ".join(str(v) for v in versions)
