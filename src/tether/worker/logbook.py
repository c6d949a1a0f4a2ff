"""The logbook: writes the lines handlers log (``ctx.log``) to their jobs' logs, in
batches.

A line is only appended to a buffer where the handler runs (the event loop or a handler
thread), so logging never waits on the database. The first line of a batch schedules a
write :data:`FLUSH_AFTER` seconds later; whatever the handlers log meanwhile goes in the
same write, and every job's lines of a round go in one transaction. A job's pending
lines are also written just before its outcome (the completer calls
:meth:`Logbook.flush`), since after it the lease that fences them is gone: a reader that
sees the job finished has seen all its lines. A job that logs nothing costs nothing
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from tether.config import LoopBackoff
from tether.joblog import LogBatch, PendingLine
from tether.service import Service
from tether.store.protocols import JobLogStore

log = logging.getLogger("tether.worker")
#: Seconds from a batch's first line to its write: lines show up live well within a
#: second, and a chatty handler costs one write per job per this much time.
FLUSH_AFTER = 0.2
BACKOFF = LoopBackoff(after_errors=1, ceiling=5.0)


@dataclass
class _Pending:
    token: int
    lines: list[PendingLine] = field(default_factory=list)
    #: Lines beyond what the job could keep, counted instead of buffered.
    dropped: int = 0
    size: int = 0


class Logbook(Service):
    """Buffers the lines of the jobs a worker runs and writes them in batches."""

    name = "logbook"

    def __init__(
        self,
        store: JobLogStore,
        *,
        max_lines: int,
        max_bytes: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__(1.0, backoff=BACKOFF, logger=log)
        self.store = store
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._loop = loop
        self._loop_thread = threading.get_ident()
        # Handler threads append too: every touch of the buffers is under this lock.
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._scheduled = False
        # One write at a time: a job's lines take consecutive seqs.
        self._writing = asyncio.Lock()

    @property
    def pending(self) -> bool:
        """Whether any line waits to be written."""
        return bool(self._pending)

    def add(self, job_id: int, lease_token: int, line: PendingLine) -> None:
        """Buffer a line of the job's (what its context's ``log`` calls), from the event
        loop or a handler thread."""
        with self._lock:
            entry = self._pending.get(job_id)
            if entry is None:
                entry = self._pending[job_id] = _Pending(lease_token)
            # A prefix, as the store keeps: after one line dropped, every later one is.
            fits = len(entry.lines) < self.max_lines and entry.size + line.size <= self.max_bytes
            if fits and not entry.dropped:
                entry.lines.append(line)
                entry.size += line.size
            else:  # the store would drop it anyway: count it, and bound the memory
                entry.dropped += 1
            first, self._scheduled = not self._scheduled, True
        if first:
            if threading.get_ident() == self._loop_thread:
                self._loop.call_later(FLUSH_AFTER, self.wake)
                return
            # A closed loop: an abandoned handler thread logging after its worker stopped.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.call_later, FLUSH_AFTER, self.wake)

    async def run_once(self) -> int:
        """Write every pending line; returns how many lines were written or dropped."""
        return await self._write(None)

    async def flush(self, job_ids: Iterable[int]) -> None:
        """Write the pending lines of ``job_ids`` now (before their outcomes). A failure
        is logged, not raised: an outcome does not wait on its log."""
        if not self._pending:
            return
        try:
            await self._write(set(job_ids))
        except Exception as exc:
            log.warning("could not write the log lines of finishing jobs: %s", exc)

    async def _write(self, only: set[int] | None) -> int:
        async with self._writing:
            with self._lock:
                if only is None:
                    batch, self._pending = self._pending, {}
                    self._scheduled = False
                else:
                    batch = {i: self._pending.pop(i) for i in only if i in self._pending}
                    if not self._pending:
                        self._scheduled = False
            if not batch:
                return 0
            items = list(batch.items())
            try:
                done = await self.store.append_log_batches(
                    [LogBatch(i, e.token, e.lines, e.dropped) for i, e in items],
                    max_lines=self.max_lines,
                    max_bytes=self.max_bytes,
                )
            except BaseException:
                self._put_back(items)
                raise
            if done.busy:
                # Rows held elsewhere (a delete in progress, an operator): those lines
                # wait for the next round, still fenced by their leases.
                self._put_back([(i, e) for i, e in items if i in done.busy])
            lost = sum(len(e.lines) for i, e in items if i not in done.taken | done.busy)
            if lost:
                log.debug("%d log line(s) of jobs whose lease was lost not kept", lost)
            return sum(len(e.lines) + e.dropped for i, e in items if i in done.taken)

    def _put_back(self, items: list[tuple[int, _Pending]]) -> None:
        with self._lock:
            for job_id, entry in items:
                newer = self._pending.get(job_id)
                if newer is not None:
                    entry.lines += newer.lines
                    entry.dropped += newer.dropped
                    entry.size += newer.size
                self._pending[job_id] = entry
            if self._pending and not self._scheduled:
                self._scheduled = True
                self._loop.call_later(FLUSH_AFTER, self.wake)
