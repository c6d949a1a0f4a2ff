"""PostgreSQL's named queries (see :mod:`tether.store.sql`)."""

from tether.store.sql.postgres import auth, feed, fragments, jobs, rows

__all__ = ["auth", "feed", "fragments", "jobs", "rows"]
