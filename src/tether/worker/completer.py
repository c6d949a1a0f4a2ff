"""The completer: records outcomes in batches, fenced by lease token."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from tether.config import LoopBackoff
from tether.errors import RowLocked
from tether.job import Finished, Outcome
from tether.service import Service
from tether.store import Store

if TYPE_CHECKING:
    from tether.worker.logbook import Logbook

# Every part of the worker logs as ``tether.worker``: operators filter on that one name.
log = logging.getLogger("tether.worker")
#: Told whether the store accepted an outcome (its lease still held).
Recorded = Callable[[bool], None]
# A finishing job waits on the completer: it backs off after the first failure, but
# never for more than a few seconds.
BACKOFF = LoopBackoff(after_errors=1, ceiling=5.0)


class Completer(Service):
    """Records outcomes; whatever piles up during one write goes in the next."""

    name = "completer"

    def __init__(self, store: Store, worker_id: str, *, logbook: Logbook | None = None) -> None:
        super().__init__(1.0, backoff=BACKOFF, logger=log)
        self.store = store
        self.worker_id = worker_id
        #: Writes the finishing jobs' pending log lines first: after the outcome, the
        #: lease that fences them is gone.
        self.logbook = logbook
        self.pending: list[tuple[Outcome, Recorded | None]] = []
        #: Set while no write is in progress (a stopping worker waits for it).
        self.idle = asyncio.Event()
        self.idle.set()

    def submit(self, outcome: Outcome, recorded: Recorded | None = None) -> None:
        """Queue an outcome; ``recorded`` is told, once it is written, whether the store
        accepted it. (A plain callback, not a future per job: this runs for every job.)"""
        self.pending.append((outcome, recorded))
        self.wake()

    async def run_once(self) -> int:
        """Write what is pending; returns how many outcomes were written."""
        batch, self.pending = self.pending, []
        if not batch:
            return 0
        self.idle.clear()
        try:
            if self.logbook is not None and self.logbook.pending:
                await self.logbook.flush(o.job_id for o, _ in batch)
            accepted = await self._finish(batch)
        except BaseException:
            self.pending[:0] = batch
            raise
        finally:
            self.idle.set()
        if accepted.held:
            # Rows someone else holds locked (a caller's transaction, an operator):
            # still ours, so neither recorded nor lost. They go again next round, by
            # the timer, not at once: the lock may be held for a while.
            self.pending[:0] = [(o, r) for o, r in batch if o.job_id in accepted.held]
            batch = [(o, r) for o, r in batch if o.job_id not in accepted.held]
            log.info(
                "%d outcome(s) wait for row locks held elsewhere; trying again",
                len(accepted.held),
            )
        for outcome, recorded in batch:
            if recorded is None:
                continue
            try:
                recorded(outcome.job_id in accepted)
            except Exception:  # one job's bookkeeping must not strand the others
                log.exception("job %s: internal error in the worker", outcome.job_id)
        return len(batch)

    async def _finish(self, batch: list[tuple[Outcome, Recorded | None]]) -> Finished:
        """Write the batch in one statement. If its transition had to wait too long for a
        row someone else holds (a limit's row, a dependent's: :class:`RowLocked`, which
        rolled the whole statement back), write each outcome alone, so that only the
        ones that touch the held row wait for a later round."""
        outcomes = [o for o, _ in batch]
        try:
            return await self.store.finish(self.worker_id, outcomes)
        except RowLocked:
            if len(outcomes) == 1:
                raise
        done = Finished()
        held: set[int] = set()
        for outcome in outcomes:
            try:
                one = await self.store.finish(self.worker_id, [outcome])
            except RowLocked:
                held.add(outcome.job_id)
                continue
            done |= one
            held |= one.held
        done.held = frozenset(held)
        return done
