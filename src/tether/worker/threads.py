"""The handler thread pool and what its threads are doing.

A thread handler cannot be stopped, only abandoned: its thread runs on and holds a pool
thread until it ends by itself. The pool has ``SPARE_THREADS`` beyond ``concurrency`` for
such threads; the claimer takes no thread job that would wait for a thread, and past
``max_abandoned_threads`` the worker stops for a fresh one to take over.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tether import metrics
from tether.task import Task
from tether.worker.ports import PoolOwner
from tether.worker.run import Run

# Every part of the worker logs as ``tether.worker``: operators filter on that one name.
log = logging.getLogger("tether.worker")
# Threads in the handler pool beyond ``concurrency``: room for abandoned handlers.
SPARE_THREADS = 4
# The exit status of a worker that stopped so that its supervisor starts a fresh one
# (EX_TEMPFAIL: systemd's Restart=on-failure and most supervisors restart on it).
EXIT_RESTART = 75


class HandlerThreads:
    """The pool thread handlers run in, and its accounting: threads taken, abandoned
    handlers still running, whether the pool is full, and the worker row's copy.

    ``tasks`` are the worker's (by name); past ``max_abandoned`` abandoned threads the
    worker restarts; ``record(abandoned, full)`` writes the pool's state to the
    worker's row.
    """

    def __init__(
        self,
        worker: PoolOwner,
        *,
        tasks: Mapping[str, Task],
        concurrency: int,
        max_abandoned: int | None,
        record: Callable[[int, bool], Awaitable[None]],
    ) -> None:
        self.worker = worker
        self.max_abandoned = max_abandoned
        self.record = record
        self.size = concurrency + SPARE_THREADS
        self.pool = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="tether-job")
        threaded = sorted(n for n, t in tasks.items() if t.executor == "thread")
        self.unthreaded_task_names = sorted(n for n in tasks if n not in threaded)
        self._threaded_task_names = threaded
        #: Pool threads taken: by thread handlers running or waiting for a thread, and by
        #: abandoned ones that still run.
        self.busy = 0
        #: Attempts whose handler thread was abandoned but still runs.
        self.abandoned: set[Run] = set()
        self.full = False
        self._reported = (0, False)
        self._report_lock = asyncio.Lock()
        self._reports: set[asyncio.Task[None]] = set()

    def room(self) -> int | None:
        """Pool threads free for thread jobs (``None``: the app has no thread tasks)."""
        if not self._threaded_task_names:
            return None
        return self.size - self.busy

    def taken(self, run: Run, thread: concurrent.futures.Future[Any]) -> None:
        """``run``'s handler holds (or waits for) a pool thread until ``thread`` ends."""
        self.busy += 1
        thread.add_done_callback(
            functools.partial(self._freed_threadsafe, asyncio.get_running_loop(), run)
        )

    def _freed_threadsafe(
        self, loop: asyncio.AbstractEventLoop, run: Run, _: concurrent.futures.Future[Any]
    ) -> None:
        # Called in the pool thread (or at once, if already done).
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to tell
            loop.call_soon_threadsafe(self._freed, run)

    def _freed(self, run: Run) -> None:
        self.busy -= 1
        if run in self.abandoned:
            self.abandoned.discard(run)
            metrics.threads_abandoned(-1)
            log.info(
                "job %s: its abandoned thread has ended (%d abandoned still running)",
                run.job.id,
                len(self.abandoned),
            )
        self._changed()
        self.worker.claim_more()

    def abandon(self, run: Run) -> None:
        """``run`` was settled while its handler thread still runs."""
        self.abandoned.add(run)
        metrics.threads_abandoned(1)
        log.warning(
            "job %s (%s): its handler thread ignored being stopped and still runs; "
            "%d abandoned thread(s) hold %d of %d pool threads",
            run.job.id,
            run.job.task,
            len(self.abandoned),
            len(self.abandoned),
            self.size,
        )
        self._changed()

    def _changed(self) -> None:
        """Report the pool's state; stop the worker past ``max_abandoned_threads``."""
        w = self.worker
        full = bool(self.abandoned) and self.busy >= self.size
        if full != self.full:
            self.full = full
            metrics.thread_pool_full(full)
            if full:
                log.error(
                    "thread pool exhausted: %d abandoned handler thread(s) still run; no "
                    "thread jobs (%s) are claimed until one ends. Restart the worker to "
                    "get the threads back (max_abandoned_threads does it for you)",
                    len(self.abandoned),
                    ", ".join(self._threaded_task_names),
                )
            else:
                log.warning("thread pool has room again: claiming thread jobs")
        limit = self.max_abandoned
        if limit is not None and len(self.abandoned) > limit and not w.stopping:
            log.error(
                "%d abandoned handler threads still run (max_abandoned_threads=%d): "
                "stopping gracefully, for a fresh worker to take over (exit code %d)",
                len(self.abandoned),
                limit,
                EXIT_RESTART,
            )
            w.restart()
        self.report()

    #: The worker stopped and flushed its reports.
    _flushed = False

    def report(self) -> None:
        """Write the abandoned-thread count and pool state to the worker's row, if they
        changed since the last successful write."""
        if self._flushed or (len(self.abandoned), self.full) == self._reported:
            return  # after the worker's last flush its loop may close: nothing to write to
        task = asyncio.ensure_future(self._write())
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def flush(self) -> None:
        """Wait for the reports still on their way (a stopping worker's loop may close
        right after it stops); a thread that ends later reports nothing."""
        self._flushed = True
        await asyncio.gather(*self._reports, return_exceptions=True)

    async def _write(self) -> None:
        # One write at a time, each with the state current when it is sent: the last
        # one to land is the latest.
        async with self._report_lock:
            state = (len(self.abandoned), self.full)
            if state == self._reported:
                return
            try:
                await self.record(*state)
            except Exception as exc:  # the heartbeat tries again
                log.warning("could not record this worker's abandoned threads: %s", exc)
                return
            self._reported = state
