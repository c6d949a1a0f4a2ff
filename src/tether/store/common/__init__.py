"""The store, written once for both dialects.

Each module holds one concern's methods (the protocols of :mod:`tether.store.protocols`)
as a mixin over :class:`~tether.store.common.base.SqlBase`; :class:`SqlStore` is all of
them. A dialect's store subclasses it, supplies the connection plumbing and its SQL
(:mod:`tether.store.sql`), and overrides only what its database does differently.
"""

from __future__ import annotations

from tether.store.common.auth import AuthSql
from tether.store.common.base import SqlBase
from tether.store.common.leases import LeasesSql


class SqlStore(AuthSql, LeasesSql, SqlBase):
    """Every store method written once; see the module docstring."""


__all__ = ["SqlBase", "SqlStore"]
