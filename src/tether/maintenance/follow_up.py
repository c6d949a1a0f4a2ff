"""The cancellation follow-up: completes records that settled while their job still ran."""

from __future__ import annotations

import logging

from tether.cancellation import CancellationService
from tether.service import Service

log = logging.getLogger("tether.follow_up")


class CancellationFollowUp(Service):
    """Each round, completes the ``partial`` cancellation records whose still-running
    jobs have stopped since (see :meth:`CancellationService.follow_up`).

    Any number of workers may run it: two that complete the same record write the same
    steps, and a completed record is no longer looked at.
    """

    name = "cancellation follow-up"

    def __init__(
        self,
        cancellations: CancellationService,
        *,
        interval: float,
        max_consecutive_errors: int = 3,
        max_backoff: float = 30.0,
    ) -> None:
        super().__init__(
            interval,
            max_consecutive_errors=max_consecutive_errors,
            max_backoff=max_backoff,
            logger=log,
        )
        self.cancellations = cancellations

    async def run_once(self) -> list[str]:
        """One round; returns the ids of the records completed."""
        done = await self.cancellations.follow_up()
        for record_id in done:
            log.info("cancellation %s: its job has stopped; record completed", record_id)
        return done
