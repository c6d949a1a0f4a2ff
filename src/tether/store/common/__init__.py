"""The store, written once for both dialects.

Each module holds one concern's methods (the protocols of :mod:`tether.store.protocols`)
as a mixin over :class:`~tether.store.common.base.SqlBase`; :class:`SqlStore` is all of
them. A dialect's store subclasses it, supplies the connection plumbing and its SQL
(:mod:`tether.store.sql`), and overrides only what its database does differently.
"""

from __future__ import annotations

from tether.store.common.auth import AuthSql
from tether.store.common.base import SqlBase
from tether.store.common.cancellations import CancellationsSql
from tether.store.common.enqueue import EnqueueSql
from tether.store.common.feed import FeedSql
from tether.store.common.jobs import JobsSql
from tether.store.common.leases import LeasesSql
from tether.store.common.logs import LogsSql
from tether.store.common.maintenance import MaintenanceSql
from tether.store.common.queues import QueuesSql
from tether.store.common.schedules import SchedulesSql
from tether.store.common.schema import SchemaSql
from tether.store.common.steps import StepsSql
from tether.store.common.workers import WorkersSql


class SqlStore(
    AuthSql,
    CancellationsSql,
    EnqueueSql,
    FeedSql,
    JobsSql,
    StepsSql,
    LeasesSql,
    LogsSql,
    MaintenanceSql,
    QueuesSql,
    SchedulesSql,
    SchemaSql,
    WorkersSql,
    SqlBase,
):
    """Every store method written once; see the module docstring."""


__all__ = ["SqlBase", "SqlStore"]
