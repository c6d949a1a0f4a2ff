"""PostgreSQL's named queries (see :mod:`tether.store.sql`)."""

from tether.store.sql.postgres import (
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
]
