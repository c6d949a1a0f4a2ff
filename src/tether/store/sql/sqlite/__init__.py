"""SQLite's named queries (see :mod:`tether.store.sql`). Times are Unix seconds (``NOW``)."""

from tether.store.sql.sqlite import (
    auth,
    cancellations,
    fragments,
    queues,
    rows,
    workers,
    workflow,
)

__all__ = [
    "auth",
    "cancellations",
    "fragments",
    "queues",
    "rows",
    "workers",
    "workflow",
]
