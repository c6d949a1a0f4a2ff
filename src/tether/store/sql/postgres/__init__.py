"""PostgreSQL's named queries (see :mod:`tether.store.sql`)."""

from tether.store.sql.postgres import auth, fragments, maintenance, rows, schedules, schema

__all__ = ["auth", "fragments", "maintenance", "rows", "schedules", "schema"]
