"""The pruner: deletes finished jobs, old audit rows and gone workers after their retention."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from tether import metrics
from tether.config import LoopBackoff, RetentionConfig
from tether.maintenance.leader import Duty, LeaderElection
from tether.ops import PruneReport
from tether.store.protocols import MaintenanceStore

log = logging.getLogger("tether.pruner")
# Pruning runs once a minute by default (RetentionConfig.interval), and a worker's 30 s
# ceiling would shorten its waits while it fails: a worker's pruner keeps this one.
BACKOFF = LoopBackoff(ceiling=300.0)

Progress = Callable[[str, PruneReport], None]
"""Called after every batch with what it was about (a state, ``audit`` or ``workers``)
and the running totals."""


class Pruner(Duty):
    """Each round, deletes what outlived its retention (see :class:`RetentionConfig`),
    in batches of ``batch_size`` rows, one short transaction each.

    With a ``leader``, only the maintenance leader prunes; without one (a test, or
    ``tether prune``), every call prunes. Pruning is safe when two pruners overlap: each
    batch deletes only rows that are prunable whoever looks.
    """

    name = "pruner"

    def __init__(
        self,
        store: MaintenanceStore,
        retention: RetentionConfig,
        *,
        leader: LeaderElection | None = None,
        backoff: LoopBackoff = BACKOFF,
    ) -> None:
        super().__init__(retention.interval, leader=leader, backoff=backoff, logger=log)
        self.store = store
        self.retention = retention

    async def run_once(self) -> PruneReport | None:
        """One round; returns what was deleted (``None``: not the leader)."""
        if not self.leads():
            return None
        report = await self.prune()
        if report.total:
            log.info(
                "pruned %s",
                ", ".join(f"{n} {kind}" for kind, n in report.counts.items() if n),
            )
        return report

    async def prune(
        self,
        *,
        states: Sequence[str] | None = None,
        older_than: float | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> PruneReport:
        """Prune jobs in ``states`` (default: every final state with a retention) older
        than ``older_than`` seconds (default: each state's retention); with no
        ``states`` given, audit and worker rows too. ``dry_run`` counts instead."""
        ret = self.retention
        report = PruneReport(dry_run=dry_run)
        ages: dict[str, float | None] = dict(ret.job_ages())
        if states is not None:
            ages = {s: older_than if older_than is not None else ages.get(s) for s in states}
        elif older_than is not None:
            ages = dict.fromkeys(ages, older_than)
        # A failed job is retried by a person, and its next attempt may read the rest of
        # its workflow (a fan-in over its children): while it is not prunable itself,
        # its workflow stays whole. It becomes prunable at the age this call prunes
        # failed jobs at (the configured retention when the call leaves them alone).
        failed_age = ages["failed"] if ages.get("failed") is not None else ret.failed
        for state, age in ages.items():
            if age is not None:
                await self._jobs(state, age, failed_age, report, progress)
        if states is None:
            for kind, age in (("audit", ret.audit), ("workers", ret.workers)):
                if age is not None:
                    await self._rows(kind, age, report, progress)
        return report

    async def _jobs(
        self,
        state: str,
        age: float,
        failed_age: float | None,
        report: PruneReport,
        progress: Progress | None,
    ) -> None:
        cursor: tuple[object, int] | None = None
        while True:
            batch = await self.store.prune_jobs(
                state,
                age,
                self.retention.batch_size,
                cursor,
                report.dry_run,
                failed_age=failed_age,
            )
            self._count(batch.counts, report)
            report.kept += batch.kept
            if progress is not None:
                progress(state, report)
            if batch.scanned < self.retention.batch_size:
                return
            cursor = batch.cursor
            if not report.dry_run:
                await self._pause()

    async def _rows(
        self, kind: str, age: float, report: PruneReport, progress: Progress | None
    ) -> None:
        size = self.retention.batch_size
        while True:
            n = await self.store.prune_rows(kind, age, size, report.dry_run)
            self._count({kind: n}, report)
            if progress is not None:
                progress(kind, report)
            # A dry run counts everything at once.
            if report.dry_run or n < size:
                return
            await self._pause()

    def _count(self, counts: dict[str, int], report: PruneReport) -> None:
        report.add(counts)
        if not report.dry_run:
            for kind, n in counts.items():
                metrics.pruned(kind, n)

    async def _pause(self) -> None:
        # Between batches, others get the write lock (SQLite) and the rows (PostgreSQL).
        await asyncio.sleep(self.retention.batch_pause)
