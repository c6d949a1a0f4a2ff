"""The maintenance leader: one worker at a time rescues, follows up cancellations, prunes,
fires schedules and releases pending workflow steps (every worker watches the heartbeat
counters meanwhile; see :class:`~tether.maintenance.rescuer.BeatWatch`).

Leadership is a lease row (``tether_leaders``) stamped with database time, on both
stores. A PostgreSQL advisory lock would need a session held open by the leader, and a
frozen leader (SIGSTOP, a paused VM) keeps its session and so its lock for as long as
the kernel keeps the socket: nobody would take over. A lease row simply runs out. It
also costs no connection: the renewal is one short statement from the worker's pool.

Two leaders can still overlap briefly (a leader frozen between its check and its
action, or clocks that disagree on SQLite). The duties are safe under overlap: a rescue
is fenced and row-locked, a follow-up write names the status it expects, a schedule
tick enqueues with an idempotency key, pruning deletes only rows that are prunable
whoever looks, and a release is a workflow step that checks its rows again under their
locks. The lease keeps the work, not the correctness, on one worker.
"""

from __future__ import annotations

import logging
import time

from tether.config import DEFAULT_BACKOFF, LoopBackoff
from tether.ops import MAINTENANCE, LeaderInfo
from tether.service import Service
from tether.store.protocols import MaintenanceStore

log = logging.getLogger("tether.leader")


class LeaderElection(Service):
    """Each round, takes or renews the maintenance lease; :attr:`leading` says whether
    this worker may act as the leader right now.

    The local belief runs out ``ttl`` seconds after the renewal was *sent* (by the
    monotonic clock), never later than the row itself, so a leader that cannot reach the
    database stops acting before anybody else may start.
    """

    name = "leader election"

    def __init__(
        self,
        store: MaintenanceStore,
        holder: str,
        *,
        ttl: float,
        interval: float,
        backoff: LoopBackoff = DEFAULT_BACKOFF,
    ) -> None:
        super().__init__(interval, backoff=backoff, logger=log)
        self.store = store
        self.holder = holder
        self.ttl = ttl
        self._until = 0.0
        self.current: LeaderInfo | None = None

    @property
    def leading(self) -> bool:
        """Whether this worker holds the lease, by its own clock."""
        return time.monotonic() < self._until

    async def run_once(self) -> bool:
        """Take or renew the lease once; returns :attr:`leading`."""
        sent = time.monotonic()
        was = self.leading
        try:
            info = await self.store.lead(MAINTENANCE, self.holder, self.ttl)
        except Exception:
            if was and not self.leading:
                log.warning("worker %s lost the maintenance lead (no database)", self.holder)
            raise
        self.current = info
        self._until = sent + self.ttl if info.holder == self.holder else 0.0
        if self.leading and not was:
            log.info(
                "worker %s now leads maintenance (rescue, cancellation follow-up, pruning, "
                "schedules, workflow releases)",
                self.holder,
            )
        elif was and not self.leading:
            log.warning("worker %s lost the maintenance lead to %s", self.holder, info.holder)
        return self.leading

    async def resign(self) -> None:
        """Hand the lease back at once (a graceful stop), so another worker takes over
        at its next round instead of after ``ttl``."""
        if self._until:
            self._until = 0.0
            await self.store.resign(MAINTENANCE, self.holder)
            log.info("worker %s resigned the maintenance lead", self.holder)


class Duty(Service):
    """A maintenance service: with a ``leader``, its rounds are the maintenance leader's
    alone (every worker runs it, the leader acts); without one (a test, a command),
    every round acts."""

    def __init__(
        self,
        interval: float,
        *,
        leader: LeaderElection | None,
        backoff: LoopBackoff,
        logger: logging.Logger,
    ) -> None:
        super().__init__(interval, backoff=backoff, logger=logger)
        self.leader = leader

    def leads(self) -> bool:
        """Whether this worker acts now: it leads, or there is no leader."""
        return self.leader is None or self.leader.leading

    def due(self) -> bool:
        """Only the maintenance leader acts (always, without a leader)."""
        return self.leads()
