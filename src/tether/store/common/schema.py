"""The schema's migrations (:class:`~tether.store.protocols.SchemaStore`)."""

from __future__ import annotations

from tether.store.base import load_migrations
from tether.store.common.base import SqlBase
from tether.store.driver import Tx


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
