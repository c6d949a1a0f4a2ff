"""The rescuer: finds dead workers and zombie jobs, and hands the jobs back, fenced."""

from __future__ import annotations

import logging

from tether import metrics
from tether.job import Job
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
    ) -> None:
        super().__init__(
            interval,
            max_consecutive_errors=max_consecutive_errors,
            max_backoff=max_backoff,
            logger=log,
        )
        self.store = store
        self.session_grace = session_grace

    async def run_once(self) -> list[Job]:
        """One round; returns the jobs rescued."""
        dead = await self.store.mark_dead_workers(process_gone, self.session_grace)
        for worker_id in dead:
            log.warning("worker %s is dead; its jobs will be rescued", worker_id)
        # Every worker rescues, not only the maintenance leader: the rescue is fenced and
        # row-locked, so two rescuers never both move a job, while a frozen leader
        # (SIGSTOP, a VM pause) keeps its session and its lock and would stall recovery.
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
