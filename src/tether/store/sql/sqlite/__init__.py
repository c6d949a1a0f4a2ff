"""SQLite's named queries (see :mod:`tether.store.sql`). Times are Unix seconds (``NOW``)."""

from tether.store.sql.sqlite import auth, fragments, leases, rows, workflow

__all__ = ["auth", "fragments", "leases", "rows", "workflow"]
