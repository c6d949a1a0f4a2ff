"""SQLite's named queries (see :mod:`tether.store.sql`). Times are Unix seconds (``NOW``)."""

from tether.store.sql.sqlite import auth, enqueue, fragments, rows, workflow

__all__ = ["auth", "enqueue", "fragments", "rows", "workflow"]
