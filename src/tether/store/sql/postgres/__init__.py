"""PostgreSQL's named queries (see :mod:`tether.store.sql`)."""

from tether.store.sql.postgres import auth

__all__ = ["auth"]
