"""The rescuer: finds dead workers and zombie jobs, and hands the jobs back, fenced."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from tether import metrics
from tether.config import DEFAULT_BACKOFF, LoopBackoff
from tether.hooks import Hooks, OutcomeEvent
from tether.job import Job
from tether.maintenance.leader import Duty, LeaderElection
from tether.procinfo import process_gone
from tether.store.protocols import MaintenanceStore

log = logging.getLogger("tether.rescuer")

#: The lease assumed for a worker whose row names none (it has not beaten yet, or runs
#: an older tether that does not count its beats): WorkerConfig's default.
DEFAULT_LEASE = 10.0


class BeatWatch:
    """Liveness judged by heartbeats arriving, not by comparing clocks.

    For every live worker, the last beat count seen and the moment (this process's
    monotonic clock) it was first seen. A worker is *quiet* once its count has stood
    still for at least its lease. Its beats commit no later than the moment they are
    first seen, so a quiet worker has had no beat land for a whole lease, and it fenced
    itself ``self_fence_margin`` before that (its fence point is measured from the send
    time of its last beat that landed, on its own monotonic clock; the two monotonic
    clocks are assumed to run at the same rate, not to agree on the time). A step of
    any wall clock (the database server's, a process's) changes nothing here.

    Pure bookkeeping: :meth:`observe` is fed the counts read from the database.
    """

    def __init__(self) -> None:
        self.seen: dict[str, tuple[int, float]] = {}
        self.leases: dict[str, float | None] = {}

    def observe(self, beats: Mapping[str, tuple[int, float | None]], now: float) -> None:
        """Record the counts (and leases) read; ``now`` is when the read returned.
        Workers no longer listed (stopped, dead) are forgotten."""
        seen: dict[str, tuple[int, float]] = {}
        for worker_id, (count, _lease) in beats.items():
            old = self.seen.get(worker_id)
            seen[worker_id] = old if old is not None and old[0] == count else (count, now)
        self.seen = seen
        self.leases = {worker_id: lease for worker_id, (_count, lease) in beats.items()}

    def still(self, now: float, at_least: float) -> list[str]:
        """The workers whose count stood still for at least ``at_least`` seconds."""
        return [w for w, (_count, since) in self.seen.items() if now - since >= at_least]

    def quiet(self, now: float, default_lease: float = DEFAULT_LEASE) -> dict[str, int]:
        """The workers whose count stood still for at least their lease, with that count
        (the store checks it again under the row's lock)."""
        return {
            worker_id: count
            for worker_id, (count, since) in self.seen.items()
            if now - since >= (self.leases.get(worker_id) or default_lease)
        }


class Rescuer(Duty):
    """Each round:

    1. reads every live worker's beat counter (:class:`BeatWatch`);
    2. marks dead the workers whose process is gone, where a pid check means anything
       (the same boot, PID namespace and machine: :func:`~tether.procinfo.process_gone`),
       and (PostgreSQL) the workers whose database session is gone and whose beat count
       this rescuer watched stand still for the session grace;
    3. moves to ``retrying`` (or ``failed`` once its attempts are spent, or
       ``cancelled`` if a cancel was pending), bumping its lease token so the old
       worker's writes fail, every running job whose worker is dead or stopped, and
       every running job whose lease expired while this rescuer watched its worker's
       counter stand still for a lease. A worker whose beats still arrive keeps its
       jobs, whatever the clocks say, and so does a job whose row someone held locked
       (its lease could not be extended). Rows held by others are skipped, never
       waited for: one held row delays nothing else, and is tried again next round.

    With a ``leader``, steps 2 and 3 of :meth:`run` are the maintenance leader's alone,
    so the fleet makes one pass per ``interval`` however many workers it has. Every
    worker keeps step 1 (one read of the workers' rows a round), so a worker that takes
    the lead has watched the counters all along and rescues at once: when the leader
    dies or freezes, the rescue waits for at most ``leader_ttl`` plus a round or two.
    Each worker also fences itself: one that cannot count a beat stops its jobs before
    any rescuer may judge it quiet. Every worker also makes one pass when it starts.
    """

    name = "rescuer"

    def __init__(
        self,
        store: MaintenanceStore,
        *,
        interval: float,
        session_grace: float,
        leader: LeaderElection | None = None,
        lease: float = DEFAULT_LEASE,
        clock: Callable[[], float] = time.monotonic,
        backoff: LoopBackoff = DEFAULT_BACKOFF,
        hooks: Hooks | None = None,
    ) -> None:
        super().__init__(interval, leader=leader, backoff=backoff, logger=log)
        self.store = store
        self.hooks = hooks or Hooks()
        self.session_grace = session_grace
        self.lease = lease
        #: The monotonic clock the counts are watched by (a test may pass its own).
        self.clock = clock
        self.watch = BeatWatch()

    async def off_duty(self) -> None:
        """Not leading: keep watching the counters, so as to act at once on taking over."""
        await self.observe()

    async def observe(self) -> None:
        """Read the live workers' beat counters into :attr:`watch`."""
        beats = await self.store.worker_beats()
        self.watch.observe(beats, self.clock())

    async def run_once(self) -> list[Job]:
        """One round; returns the jobs rescued."""
        await self.observe()
        quiet = self.watch.quiet(self.clock(), self.lease)
        # A lost session makes a worker dead only once its count also stood still for
        # the grace on this clock: the database's own clock may have stepped.
        still = self.watch.still(self.clock(), self.session_grace)
        dead = await self.store.mark_dead_workers(process_gone, self.session_grace, still)
        for worker_id in dead:
            log.warning("worker %s is dead; its jobs will be rescued", worker_id)
        # Two rescuers (leaders overlapping, a worker's opening pass) are safe: the rescue
        # is fenced and row-locked, so two never both move a job.
        rescued = await self.store.rescue(quiet)
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
            if self.hooks.hears_outcomes:
                await self.hooks.outcome(OutcomeEvent("rescued", job, reason=job.error))
        return rescued
