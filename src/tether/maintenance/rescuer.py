"""The rescuer: finds dead workers and zombie jobs, and hands the jobs back, fenced."""

from __future__ import annotations

import logging

from tether import metrics
from tether.job import Job
from tether.maintenance.leader import LeaderElection
from tether.procinfo import process_gone
from tether.service import Service
from tether.store.protocols import MaintenanceStore

log = logging.getLogger("tether.rescuer")


class Rescuer(Service):
    """Each round:

    1. marks dead the workers whose process is gone, where a pid check means anything
       (the same boot, PID namespace and machine: :func:`~tether.procinfo.process_gone`),
       and (PostgreSQL) the workers whose database session is gone and whose heartbeat
       is stale;
    2. moves every running job whose lease expired or whose worker is dead
       to ``retrying`` (or ``failed`` once its attempts are spent, or ``cancelled`` if a
       cancel was pending), bumping its lease token so the old worker's writes fail.

    With a ``leader``, the rounds of :meth:`run` are the maintenance leader's alone, so
    the fleet makes one pass per ``interval`` however many workers it has (each pass
    reads the live workers and the running jobs once, through indexes).
    Each worker still fences itself: one that cannot renew its leases stops its jobs.
    A leader that dies or freezes loses its lease row within ``leader_ttl`` and another
    worker takes the duty over; every worker also makes one pass when it starts.
    """

    name = "rescuer"

    def __init__(
        self,
        store: MaintenanceStore,
        *,
        interval: float,
        session_grace: float,
        max_consecutive_errors: int = 3,
        max_backoff: float = 30.0,
        leader: LeaderElection | None = None,
    ) -> None:
        super().__init__(
            interval,
            max_consecutive_errors=max_consecutive_errors,
            max_backoff=max_backoff,
            logger=log,
        )
        self.store = store
        self.session_grace = session_grace
        self.leader = leader

    def due(self) -> bool:
        """Only the maintenance leader rescues (always, without a leader)."""
        return self.leader is None or self.leader.leading

    async def run_once(self) -> list[Job]:
        """One round; returns the jobs rescued."""
        dead = await self.store.mark_dead_workers(process_gone, self.session_grace)
        for worker_id in dead:
            log.warning("worker %s is dead; its jobs will be rescued", worker_id)
        # Two rescuers (leaders overlapping, a worker's opening pass) are safe: the rescue
        # is fenced and row-locked, so two never both move a job.
        rescued = await self.store.rescue()
        metrics.zombies_rescued(len(rescued))
        for job in rescued:
            log.warning(
                "rescued job %s (%s) from worker %s: now %s (attempt %d/%d)",
                job.id,
                job.task,
                job.worker_id,
                job.state,
                job.attempt,
                job.max_attempts,
            )
        return rescued
