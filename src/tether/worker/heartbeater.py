"""The heartbeater: one write per interval for every lease, and the worker's self-fencing.

It extends the leases, flushes progress, learns of cancel and pause requests and of lost
leases, and stops the jobs whose leases may have expired when the database has been
unreachable for too long.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tether import metrics
from tether.config import LoopBackoff, WorkerConfig
from tether.job import Beat
from tether.logs import job_fields
from tether.service import Service
from tether.store.protocols import LeaseStore
from tether.worker.ports import Holder
from tether.worker.run import Run, beat

# Every part of the worker logs as ``tether.worker``: operators filter on that one name.
log = logging.getLogger("tether.worker")
# The heartbeat never backs off: every round is a chance to keep the leases, and one
# that fails still fences the jobs that are due (_maybe_fence).
NO_BACKOFF = LoopBackoff(after_errors=10**9)


class Heartbeater(Service):
    """One write per interval for every lease this worker holds.

    ``claiming()`` says whether a claim is out (its jobs may be missing from
    ``running`` yet); ``report_threads()`` writes the pool's state again if its last
    write failed; ``recovered()`` wakes the worker's other loops once the database
    answers again.
    """

    name = "heartbeat"

    def __init__(
        self,
        store: LeaseStore,
        worker_id: str,
        config: WorkerConfig,
        worker: Holder,
        *,
        claiming: Callable[[], bool],
        report_threads: Callable[[], None],
        recovered: Callable[[], None],
    ) -> None:
        super().__init__(config.heartbeat_interval, backoff=NO_BACKOFF, logger=log)
        # Whether the last heartbeat was written. While it is not, the worker's row
        # looks stale, and a worker that also lost its session may be presumed dead any
        # moment: it claims nothing until a heartbeat gets through again.
        self.healthy = True
        self.store = store
        self.worker_id = worker_id
        self.config = config
        self.worker = worker
        self.claiming = claiming
        self.report_threads = report_threads
        self.recovered = recovered
        self.last_ok = asyncio.get_running_loop().time()
        self.fenced = False
        #: Whether the last beat found the worker's row held by another session.
        self.row_held = False
        #: The number of the latest beat sent (see :meth:`run_once`).
        self.seq = 0

    async def run_once(self) -> int:
        """Extend every lease; act on lost leases and control requests."""
        w = self.worker
        loop = asyncio.get_running_loop()
        runs = w.beating()
        beats = [beat(r) for r in runs]
        sent = loop.time()
        # A stalled or blackholed connection must not keep us waiting past the moment
        # we have to stop our jobs: another worker may take them once the leases end.
        timeout = max(1.0, self.config.heartbeat_interval)
        first = min((self.fence_point(r) for r in runs), default=None)
        if first is not None and first > sent:
            timeout = min(timeout, first - sent)
        elif first is not None:
            # Past a fence point already (the last rounds failed fast or the pause
            # between rounds crossed it): stop those jobs now, not after one more try.
            self._maybe_fence()
        # Not wait_for: it waits for the cancelled call to unwind, and the driver waits for
        # the server to acknowledge the cancel, which a partitioned server never does.
        # Every job the worker still holds, the ones being finished or stopped included:
        # a running job of ours missing from this list is one we dropped (a job claimed
        # later is younger than this beat's predecessor, which the rescue checks). While
        # a claim is out the list may lack its jobs: say nothing then.
        holding = None if self.claiming() else list(w.running)
        # Numbered: a call given up on below may still land after later ones, and must
        # not then count, nor write its older ``holding`` over theirs.
        self.seq += 1
        call = asyncio.ensure_future(
            self.store.heartbeat(
                self.worker_id, beats, self.config.lease_duration, holding, self.seq
            )
        )
        call.add_done_callback(_retrieve)
        try:
            done, _ = await asyncio.wait({call}, timeout=timeout)
            if not done:
                raise TimeoutError(f"no answer from the database within {timeout:.1f}s")
            res = call.result()
        except Exception:
            metrics.heartbeat_failed()
            self.healthy = False
            self._maybe_fence()
            raise
        finally:
            call.cancel()  # a no-op once it is done; never waited for
        if res.counted:
            # Proof of life is the beat counter on the worker's row, which the rescuers
            # watch (a job of a live worker is rescued only once they saw it stand still
            # for a lease): a round that moved it pushes every fence point back. Job rows
            # held by others (res.held) were skipped, not lost: their jobs run on.
            self.last_ok = sent
            self.fenced = False
            self.row_held = False
        else:
            # The worker's own row was held by another session. The jobs whose leases
            # this round extended are safe for another lease (fence_point); the others
            # fence at the usual point if it stays so.
            if not self.row_held:
                log.warning("heartbeat: the worker's row is locked elsewhere; beats not counted")
            self.row_held = True
        for run in runs:
            if run.job.id in res.alive and run.job.id not in res.held:
                run.leased_at = max(run.leased_at, sent)
        self.healthy = True
        if not res.counted:
            self._maybe_fence()
        self.report_threads()  # in case the write made when it changed failed
        if self.errors:
            # The database answers again: the loops that were backing off (for up to
            # their backoff's ceiling) try again now.
            self.recovered()
        lost = []
        for run in runs:
            if run.job.id not in res.alive and not run.finishing and run.job.id in w.running:
                log.warning("job %s: lease lost; stopping it and recording nothing", run.job.id)
                w.interrupt(run, "lease_lost")
                lost.append(run.job.id)
        if log.isEnabledFor(logging.DEBUG):  # every round of every worker: cheap when off
            self._log_round(beats, res.alive - res.held, lost, res.counted)
        heard: list[tuple[Run, str, bool]] = []
        for req in res.requests:
            held = w.running.get(req.job_id)
            if held is not None and req.cancel:
                heard.append((held, "cancel", req.force))
            elif held is not None and req.pause:
                heard.append((held, "pause", False))
        # The requests' reasons are read first (a read, only for requests not heard
        # before), so the handler's signal, the log, the hooks and a trace all say why.
        await w.log_requests([(run, kind) for run, kind, _ in heard])
        for run, kind, force in heard:
            if run.job.id in w.running:
                detail = "pause requested" if kind == "pause" else None
                w.interrupt(run, kind, force=force, detail=detail)
        return len(beats)

    def _log_round(
        self, beats: list[Beat], extended: frozenset[int], lost: list[int], counted: bool
    ) -> None:
        count = sum(1 for b in beats if b.job_id in extended)
        log.debug(
            "heartbeat of worker %s: %d lease(s) extended%s%s",
            self.worker_id,
            count,
            f", {len(lost)} lost ({', '.join(map(str, lost))})" if lost else "",
            "" if counted else " (worker row locked elsewhere: not counted)",
            extra=job_fields("heartbeat", worker_id=self.worker_id, leases=count, lost=lost),
        )

    @property
    def fence_at(self) -> float:
        """Loop time at which our leases may be about to expire, minus the margin.

        ``last_ok`` is when the last successful heartbeat was *sent*; the database
        extended the leases no earlier than that.
        """
        config = self.config
        return self.last_ok + config.lease_duration - config.self_fence_margin

    def fence_point(self, run: Run) -> float:
        """:attr:`fence_at` for one job: a job claimed (or its lease extended by a
        round whose beat was not counted) after the last counted heartbeat has a lease
        of its own, no older than that write."""
        return self.fence_at + max(0.0, run.leased_at - self.last_ok)

    def _maybe_fence(self) -> None:
        now = asyncio.get_running_loop().time()
        silent = now - self.last_ok
        due = [
            run
            for run in self.worker.running.values()
            # A timer may fire a hair early.
            if not run.finishing and now >= self.fence_point(run) - 0.01
        ]
        if not due:
            return
        if not self.fenced:
            log.error(
                "no heartbeat for %.1fs: stopping %d job(s) before their leases expire",
                silent,
                len(due),
            )
        self.fenced = True
        for run in due:
            self.worker.interrupt(run, "lease_lost")


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark an abandoned call's exception as seen (it was handled, or is moot)."""
    if not fut.cancelled():
        fut.exception()
