"""The releaser: no job waits on something that has already happened.

A transition's workflow step runs in its own transaction: a parent is released when its
last child ends, a dependent when its last dependency succeeds (or cancelled when one
fails), the active children of a parent that ended are cancelled. On PostgreSQL the
step waits for a row lock only so long (a foreign transaction may hold a row for any
time); past it, the transition commits without its step, which it records in
``tether_pending_steps``. This service is the backstop: the maintenance leader runs the
pending steps again, and walks the blocked jobs in id order, a batch a round, applying
the missed step to any that should have moved, whatever missed it. It finds nothing in
a healthy system, and says so when it does.
"""

from __future__ import annotations

import logging

from tether.config import LoopBackoff
from tether.maintenance.leader import Duty, LeaderElection
from tether.store.protocols import MaintenanceStore

log = logging.getLogger("tether.releaser")
# The backoff of a releaser built alone; a worker's shares the worker's backoff.
BACKOFF = LoopBackoff(ceiling=60.0)


class Releaser(Duty):
    """Each round, runs again up to ``batch_size`` pending workflow steps, looks at the
    next ``batch_size`` blocked jobs (through the index by state) and releases those
    that wait on something that has already happened; the cursor wraps around at the
    end. With a ``leader``, only the maintenance leader
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
        backoff: LoopBackoff = BACKOFF,
    ) -> None:
        super().__init__(interval, leader=leader, backoff=backoff, logger=log)
        self.store = store
        self.batch_size = batch_size
        self._after = 0

    async def run_once(self) -> list[int]:
        """One batch; returns the ids of the jobs whose pending steps ran again and of the
        blocked jobs it found waiting on something that had already happened."""
        stuck, last = await self.store.release_stuck(self._after, self.batch_size)
        self._after = 0 if last is None else last
        if stuck:
            log.warning(
                "ran the missed workflow steps of %d job(s) (pending, or blocked on "
                "children or dependencies that had already ended): %s",
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
