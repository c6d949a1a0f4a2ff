"""PostgreSQL's named queries (see :mod:`tether.store.sql`)."""

from tether.store.sql.postgres import auth, enqueue, fragments, rows

__all__ = ["auth", "enqueue", "fragments", "rows"]
