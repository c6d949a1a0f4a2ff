"""The store's lifecycle and its schema's migrations."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class SchemaStore(Protocol):
    """The connection's lifecycle and the schema: opening and closing the store, and the
    numbered migrations applied to its database."""

    url: str
    """The database URL this store was built for."""

    async def open(self) -> None:
        """Connect. Idempotent."""

    async def close(self) -> None:
        """Release connections and background tasks. Idempotent."""

    async def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied now."""

    async def schema_version(self) -> int:
        """The newest applied migration, 0 for an empty database."""

    async def applied_migrations(self) -> set[int]:
        """Every migration version recorded in the database (empty for a fresh one)."""
