"""SQLite's named queries (see :mod:`tether.store.sql`). Times are Unix seconds (``NOW``)."""

from tether.store.sql.sqlite import (
    auth,
    cancellations,
    enqueue,
    feed,
    fragments,
    jobs,
    leases,
    logs,
    maintenance,
    queues,
    rows,
    schedules,
    schema,
    steps,
    workers,
    workflow,
)

__all__ = [
    "auth",
    "cancellations",
    "enqueue",
    "feed",
    "fragments",
    "jobs",
    "leases",
    "logs",
    "maintenance",
    "queues",
    "rows",
    "schedules",
    "schema",
    "steps",
    "workers",
    "workflow",
]
