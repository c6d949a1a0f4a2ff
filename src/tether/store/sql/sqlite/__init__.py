"""SQLite's named queries (see :mod:`tether.store.sql`). Times are Unix seconds (``NOW``)."""

from tether.store.sql.sqlite import (
    auth,
    enqueue,
    feed,
    fragments,
    jobs,
    maintenance,
    rows,
    schedules,
    schema,
    workflow,
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
    "workflow",
]
