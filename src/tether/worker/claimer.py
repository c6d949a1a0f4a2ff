"""The claimer: leases jobs while the worker has free slots."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tether.errors import StoreError
from tether.service import Service
from tether.worker.ramp import Ramp

if TYPE_CHECKING:
    from tether.worker.worker import Worker

# Every part of the worker logs as ``tether.worker``: operators filter on that one name.
log = logging.getLogger("tether.worker")


class Claimer(Service):
    """Leases jobs while slots are free (and, during a gradual start, the ramp allows)."""

    name = "claimer"

    def __init__(self, worker: Worker) -> None:
        cfg = worker.config
        super().__init__(
            cfg.poll_interval,
            max_consecutive_errors=cfg.max_consecutive_errors,
            max_backoff=cfg.max_backoff,
            logger=log,
        )
        self.worker = worker
        self.claimed = 0
        self.ramp: Ramp | None = None
        self.started = asyncio.get_running_loop().time()
        #: Set while no round is in progress (a stopping worker waits for it).
        self.idle = asyncio.Event()
        self.idle.set()

    def delay(self) -> float:
        base = super().delay()
        if self.ramp is None or self.errors:
            return base
        elapsed = asyncio.get_running_loop().time() - self.started
        if self.ramp.allowed(elapsed) is None:
            return base
        return min(base, self.ramp.next_step(elapsed))

    async def run_once(self) -> int:
        """Claim and start up to the free slots (at most ``claim_batch``)."""
        w = self.worker
        free = w.free_slots()
        if w.stopping or free <= 0:
            return 0
        if not w.heartbeater.healthy:
            # The worker's row looks stale while its heartbeats fail, and once its
            # session is gone too it may be presumed dead at any moment: what it claimed
            # would be rescued while it ran. A failed round, so the loop backs off.
            raise StoreError("not claiming: the worker's heartbeat is failing")
        self.idle.clear()
        try:
            return await self._claim(free)
        finally:
            self.idle.set()

    async def _claim(self, free: int) -> int:
        w = self.worker
        tasks = w.task_names
        room = w.threads.room()
        if room is not None and room < free:
            # Never claim a thread job that would wait for a thread: abandoned handlers
            # may hold the pool for good.
            if room > 0:
                free = room
            elif w.threads.unthreaded_task_names:
                tasks = w.threads.unthreaded_task_names
            else:
                return 0
        limit = min(free, w.config.claim_batch)
        if self.ramp is not None:
            allowed = self.ramp.allowed(asyncio.get_running_loop().time() - self.started)
            if allowed is None:
                self.ramp = None
            else:
                limit = min(limit, allowed - self.claimed)
                if limit <= 0:
                    return 0
        # With room for more than one batch, two claims go out at once (on PostgreSQL,
        # two connections; SKIP LOCKED keeps their jobs apart): a claim's round trip,
        # not the database, is what a fast drain waits on.
        batch = w.config.claim_batch
        if free <= batch or self.ramp is not None:
            sizes = [limit]
        else:
            sizes = [batch, min(batch, free - batch)]
        sent = asyncio.get_running_loop().time()
        rounds = await asyncio.gather(
            *(
                w.store.claim(w.id, w.config.queues, tasks, size, w.config.lease_duration)
                for size in sizes
            ),
            return_exceptions=True,
        )
        got, full, failure = 0, True, None
        for size, jobs in zip(sizes, rounds, strict=True):
            if isinstance(jobs, BaseException):
                # The other claim's jobs are ours all the same: run them, then report.
                failure, full = jobs, False
                continue
            got += len(jobs)
            full = full and len(jobs) == size
            for job in jobs:
                if w.stopping:
                    w.hand_back(job)  # the claim was out when the stop began
                else:
                    w.launch(job, leased_at=sent)
        self.claimed += got
        if failure is not None:
            raise failure
        if full and w.free_slots() > 0 and self.ramp is None:
            self.wake()  # there may be more waiting
        return got
