"""The claimer: leases jobs while the worker has free slots."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from tether.config import WorkerConfig
from tether.errors import StoreError
from tether.logs import job_fields
from tether.service import Service
from tether.store.protocols import LeaseStore
from tether.worker.ports import Launcher
from tether.worker.ramp import Ramp

# Every part of the worker logs as ``tether.worker``: operators filter on that one name.
log = logging.getLogger("tether.worker")


class Claimer(Service):
    """Leases jobs while slots are free (and, during a gradual start, the ramp allows).

    ``tasks`` are the worker's; ``healthy()`` says whether the last heartbeat was
    written; ``room()`` counts the pool threads free for thread jobs (``None``: the app
    has none), and ``unthreaded`` names the tasks that need no thread.
    """

    name = "claimer"

    def __init__(
        self,
        store: LeaseStore,
        worker_id: str,
        config: WorkerConfig,
        worker: Launcher,
        *,
        tasks: Sequence[str],
        healthy: Callable[[], bool],
        room: Callable[[], int | None],
        unthreaded: Sequence[str],
    ) -> None:
        super().__init__(config.poll_interval, backoff=config.backoff, logger=log)
        self.store = store
        self.worker_id = worker_id
        self.config = config
        self.worker = worker
        self.tasks = list(tasks)
        self.healthy = healthy
        self.room = room
        self.unthreaded = list(unthreaded)
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
        if not self.healthy():
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
        w, config = self.worker, self.config
        tasks = self.tasks
        room = self.room()
        if room is not None and room < free:
            # Never claim a thread job that would wait for a thread: abandoned handlers
            # may hold the pool for good.
            if room > 0:
                free = room
            elif self.unthreaded:
                tasks = self.unthreaded
            else:
                return 0
        limit = min(free, config.claim_batch)
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
        batch = config.claim_batch
        if free <= batch or self.ramp is not None:
            sizes = [limit]
        else:
            sizes = [batch, min(batch, free - batch)]
        sent = asyncio.get_running_loop().time()
        rounds = await asyncio.gather(
            *(
                self.store.claim(self.worker_id, config.queues, tasks, size, config.lease_duration)
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
            # Checked once per round, not per job: a busy worker claims thousands a second.
            logged = log.isEnabledFor(logging.INFO)
            for job in jobs:
                if logged:
                    log.info(
                        "job %s (%s) claimed by worker %s, attempt %d",
                        job.id,
                        job.task,
                        self.worker_id,
                        job.attempt,
                        extra=job_fields(
                            "job_claimed",
                            job_id=job.id,
                            task=job.task,
                            queue=job.queue,
                            attempt=job.attempt,
                            worker_id=self.worker_id,
                        ),
                    )
                if w.stopping:
                    w.hand_back(job)  # the claim was out when the stop began
                else:
                    w.launch(job, leased_at=sent)
        self.claimed += got
        if got or failure is None:
            # Idle or busy, for the store's connections; a failed claim that found
            # nothing says neither.
            await w.found(got)
        if failure is not None:
            raise failure
        if full and w.free_slots() > 0 and self.ramp is None:
            self.wake()  # there may be more waiting
        return got
