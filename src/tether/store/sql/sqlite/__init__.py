"""SQLite's named queries (see :mod:`tether.store.sql`). Times are Unix seconds (``NOW``)."""

from tether.store.sql.sqlite import auth, fragments, maintenance, rows, schedules, schema, workflow

__all__ = ["auth", "fragments", "maintenance", "rows", "schedules", "schema", "workflow"]
