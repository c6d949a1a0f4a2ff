"""The cancellation follow-up: settles every cancellation record, whoever dies.

It completes records that settled while their job still ran, and settles from the job
states the records whose canceller died (or lost the database) half-way.
"""

from __future__ import annotations

import logging

from tether.cancellation import CancellationService
from tether.config import DEFAULT_BACKOFF, LoopBackoff
from tether.maintenance.leader import Duty, LeaderElection

log = logging.getLogger("tether.follow_up")


class CancellationFollowUp(Duty):
    """Each round, settles the records nobody settled within the adoption bound (see
    :meth:`CancellationService.adopt_stale`), then completes the ``partial`` records whose
    still-running jobs have stopped since (see :meth:`CancellationService.follow_up`).

    Any number of workers may run it: every write names the status it expects, so of
    two that reach the same record only one writes, and a settled record is left alone.
    With a ``leader``, the rounds of :meth:`run` are the maintenance leader's alone, so
    the fleet polls the records once per ``interval``, not once per worker.
    """

    name = "cancellation follow-up"

    def __init__(
        self,
        cancellations: CancellationService,
        *,
        interval: float,
        leader: LeaderElection | None = None,
        backoff: LoopBackoff = DEFAULT_BACKOFF,
    ) -> None:
        super().__init__(interval, leader=leader, backoff=backoff, logger=log)
        self.cancellations = cancellations

    async def run_once(self) -> list[str]:
        """One round; returns the ids of the records settled or completed."""
        adopted = await self.cancellations.adopt_stale()
        for record_id in adopted:
            log.warning(
                "cancellation %s: nobody settled it (its canceller is gone); "
                "settled from the job states",
                record_id,
            )
        done = await self.cancellations.follow_up()
        for record_id in done:
            log.info("cancellation %s: its job has stopped; record completed", record_id)
        return [*adopted, *done]
