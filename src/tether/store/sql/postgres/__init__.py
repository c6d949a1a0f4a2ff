"""PostgreSQL's named queries (see :mod:`tether.store.sql`)."""

from tether.store.sql.postgres import auth, fragments, leases, rows

__all__ = ["auth", "fragments", "leases", "rows"]
