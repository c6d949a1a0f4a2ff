"""The schema's migrations (:class:`~tether.store.protocols.SchemaStore`)."""

from __future__ import annotations

from tether.store.base import load_migrations, migration_version
from tether.store.common.base import SqlBase
from tether.store.driver import Tx

RENUMBERED: dict[str, tuple[tuple[str, str], ...]] = {
    "sqlite": (("0005_partial_cancellations.sql", "0006_partial_cancellations.sql"),),
}
"""Migrations a release recorded under another file name, by dialect: (old, new).

Every change has one number in both dialects. Release 0.1 numbered SQLite's
partial-cancellation index 5 where PostgreSQL had it as 6 (its 5 is the planned
triggers, a no-op on SQLite), so a SQLite database of that release records
``(5, '0005_partial_cancellations.sql')``. Before anything is applied, the runner
rewrites such a row to the new number and name, in the migration's transaction, so the
index is not built again and version 5 is then applied as what it is now. A row is
matched by its number and name: a database whose 5 is already the new one is left alone.
"""


class SchemaSql(SqlBase):
    """Which migrations the database has, and applying the others."""

    async def schema_version(self) -> int:
        async def body(tx: Tx) -> int:
            found = await tx.one(self.sql.schema.HAS_MIGRATIONS)
            if found is None or found["t"] is None:
                return 0
            row = await tx.one(self.sql.schema.SCHEMA_VERSION)
            return int(row["v"]) if row else 0

        return await self._query(body)

    async def applied_migrations(self) -> set[int]:
        async def body(tx: Tx) -> set[int]:
            found = await tx.one(self.sql.schema.HAS_MIGRATIONS)
            if found is None or found["t"] is None:
                return set()
            return {int(r["version"]) for r in await tx.all(self.sql.schema.APPLIED)}

        return await self._query(body)

    async def migrate(self) -> list[int]:
        q = self.sql.schema

        async def body(tx: Tx) -> list[int]:
            for statement in q.MIGRATE_BEGIN:
                await tx.run(statement)
            await tx.run(q.CREATE_MIGRATIONS)
            for old, new in RENUMBERED.get(q.MIGRATIONS, ()):
                renumber = {"old_version": migration_version(old), "old_name": old}
                renumber |= {"new_version": migration_version(new), "new_name": new}
                await tx.run(q.RENUMBER_MIGRATION, renumber)
            done = {r["version"] for r in await tx.all(q.APPLIED)}
            applied = []
            for mig in load_migrations(q.MIGRATIONS):
                if mig.version in done:
                    continue
                for statement in q.statements(mig.sql):
                    await tx.run(statement)
                await tx.run(q.RECORD_MIGRATION, {"version": mig.version, "name": mig.name})
                applied.append(mig.version)
            return applied

        return await self._transact(body)
