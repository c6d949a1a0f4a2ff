"""PostgreSQL's named queries (see :mod:`tether.store.sql`)."""

from tether.store.sql.postgres import (
    auth,
    cancellations,
    fragments,
    queues,
    rows,
    workers,
)

__all__ = ["auth", "cancellations", "fragments", "queues", "rows", "workers"]
