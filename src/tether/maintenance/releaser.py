"""The releaser: no job waits on something that has already happened.

A blocked job is released in the same transaction as the transition it waits for: a
parent when its last child ends, a dependent when its last dependency succeeds (or
cancelled when one fails). On PostgreSQL that release waits for a lock on the blocked
row only so long (a foreign transaction may hold it for any time), and gives up past
it; a process can also die between deciding and committing in ways no trigger sees.
This sweep is the backstop: the maintenance leader walks the blocked jobs in id order,
a batch a round, and applies the missed workflow step to any that should have moved.
It finds nothing in a healthy system, and says so when it does.
"""

from __future__ import annotations

import logging

from tether.maintenance.leader import LeaderElection
from tether.service import Service
from tether.store.protocols import MaintenanceStore

log = logging.getLogger("tether.releaser")


class Releaser(Service):
    """Each round, looks at the next ``batch_size`` blocked jobs (through the index by
    state) and releases those that wait on something that has already happened; the
    cursor wraps around at the end. With a ``leader``, only the maintenance leader
    sweeps; two sweeps at once are safe, as each release is a workflow step that checks
    the rows again under their locks."""

    name = "releaser"

    def __init__(
        self,
        store: MaintenanceStore,
        *,
        interval: float,
        batch_size: int = 500,
        leader: LeaderElection | None = None,
        max_consecutive_errors: int = 3,
        max_backoff: float = 60.0,
    ) -> None:
        super().__init__(
            interval,
            max_consecutive_errors=max_consecutive_errors,
            max_backoff=max_backoff,
            logger=log,
        )
        self.store = store
        self.batch_size = batch_size
        self.leader = leader
        self._after = 0

    def due(self) -> bool:
        """Only the maintenance leader sweeps (always, without a leader)."""
        return self.leader is None or self.leader.leading

    async def run_once(self) -> list[int]:
        """One batch; returns the ids of the blocked jobs it found waiting on something
        that had already happened."""
        stuck, last = await self.store.release_stuck(self._after, self.batch_size)
        self._after = 0 if last is None else last
        if stuck:
            log.warning(
                "released %d blocked job(s) whose children or dependencies had already ended: %s",
                len(stuck),
                ", ".join(map(str, stuck[:20])),
            )
        return stuck

    async def sweep(self) -> list[int]:
        """Every blocked job from the first, in batches (for tests and tools)."""
        self._after = 0
        found = await self.run_once()
        while self._after:
            found += await self.run_once()
        return found
