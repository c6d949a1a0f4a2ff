"""PostgreSQL's named queries (see :mod:`tether.store.sql`)."""

from tether.store.sql.postgres import (
    auth,
    enqueue,
    feed,
    fragments,
    jobs,
    maintenance,
    rows,
    schedules,
    schema,
)

__all__ = [
    "auth",
    "enqueue",
    "feed",
    "fragments",
    "jobs",
    "maintenance",
    "rows",
    "schedules",
    "schema",
]
