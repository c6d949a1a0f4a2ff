"""Cancellation latency per executor (async, thread, process): the handlers and one run.

``bench/run.py`` imports this module. Each executor has a handler that stops
cooperatively once the job is asked to stop, and records (``time.perf_counter()``) the
moment it sees the request:

- ``bench.cancel_async``: ``await ctx.cancelled.wait()``;
- ``bench.cancel_thread``: a plain ``def`` in the worker's thread pool, looping on
  ``ctx.cancelled.wait_sync(THREAD_WAIT)`` (which returns as soon as the signal is set);
- ``bench.cancel_process``: :func:`process_handler`, a module-level ``def`` run in a
  child process of its own (``executor="process"``). The worker sends it SIGTERM, whose
  handler sets ``ctx.cancelled``; the function polls ``ctx.check_cancelled()`` between
  sleeps of :data:`PROCESS_POLL` seconds, so its reading lags the signal by at most that.
  The child writes its readings to mark files (``perf_counter`` is ``CLOCK_MONOTONIC``,
  shared by all processes on the host).

Every handler then raises ``Cancelled`` (``ctx.check_cancelled()``): a handler that
returned normally would be recorded as having finished first.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tether import App, JobContext, JobState, SyncJobContext, WorkerConfig
from tether.cancellation import CancellationResult
from tether.errors import Cancelled
from tether.executors import ProcessJobContext
from workerapp import Marks, read_mark

ASYNC_TASK = "bench.cancel_async"
THREAD_TASK = "bench.cancel_thread"
PROCESS_TASK = "bench.cancel_process"
TASKS = {"async": ASYNC_TASK, "thread": THREAD_TASK, "process": PROCESS_TASK}
EXECUTORS = tuple(TASKS)

#: The thread handler's ``wait_sync`` timeout; the wait returns at once when the signal
#: is set, so this only bounds how long one loop turn lasts.
THREAD_WAIT = 0.005
#: The process handler's sleep between ``ctx.check_cancelled()`` calls: its reading can
#: lag the SIGTERM by up to this much (half of it on average).
PROCESS_POLL = 0.002
#: A handler that never sees its request gives up after this long (then the sample fails).
HANDLER_LIMIT = 120.0

#: The worker's settings. The cooperative handlers stop long before any of these bounds,
#: which only keep a misbehaving sample from stalling the run: ``cancel_grace`` (async: a
#: request -> task cancellation), ``cancel_timeout`` (thread: -> abandoned) and
#: ``kill_timeout`` (process: SIGTERM -> SIGKILL). The heartbeat keeps its default
#: interval: it is the request's fallback path and a shorter one would flatter the
#: figure; in-process the request arrives by notification (PostgreSQL NOTIFY, or the
#: SQLite store's in-process hint) and wakes the heartbeat at once.
CONFIG = WorkerConfig(concurrency=4, cancel_grace=1.0, cancel_timeout=3.0, kill_timeout=2.0)


class SharedMarks:
    """Readings taken on the event loop or in worker threads, by ``(what, job id)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: dict[tuple[str, int], float] = {}

    def mark(self, what: str, job_id: int) -> float:
        """Record that job ``job_id`` reached ``what`` now (from any thread)."""
        now = time.perf_counter()
        with self._lock:
            self._times[(what, job_id)] = now
        return now

    async def wait(self, what: str, job_id: int, timeout: float) -> float:
        """The reading of ``(what, job_id)``, polled every 1 ms (the polling does not add
        to the figure: the reading is the handler's own). Raises ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with self._lock:
                found = self._times.get((what, job_id))
            if found is not None:
                return found
            if loop.time() > deadline:
                raise TimeoutError(f"no {what!r} mark for job {job_id} within {timeout:g} s")
            await asyncio.sleep(0.001)

    def clear(self) -> None:
        """Forget every reading (job ids restart from 1 in each fresh database)."""
        with self._lock:
            self._times.clear()


MARKS = SharedMarks()


def process_handler(ctx: ProcessJobContext, marks: str) -> None:
    """Run in a child process until SIGTERM; note when the signal was seen, then stop."""
    files = Marks()
    files.directory = Path(marks)
    files.mark("started", ctx.id)
    deadline = time.monotonic() + HANDLER_LIMIT
    try:
        while time.monotonic() < deadline:
            ctx.check_cancelled()
            time.sleep(PROCESS_POLL)
    except Cancelled:
        files.mark("observed", ctx.id)
        raise


def make_app(url: str) -> App:
    """An App on ``url`` with one cooperative handler per executor."""
    app = App(url)

    @app.task(name=ASYNC_TASK)
    async def cancel_async(ctx: JobContext) -> None:
        MARKS.mark("started", ctx.id)
        await ctx.cancelled.wait()
        MARKS.mark("observed", ctx.id)
        ctx.check_cancelled()

    @app.task(name=THREAD_TASK)
    def cancel_thread(ctx: SyncJobContext) -> None:
        MARKS.mark("started", ctx.id)
        deadline = time.monotonic() + HANDLER_LIMIT
        while not ctx.cancelled.wait_sync(THREAD_WAIT) and time.monotonic() < deadline:
            pass
        MARKS.mark("observed", ctx.id)
        ctx.check_cancelled()

    app.task(name=PROCESS_TASK, executor="process")(process_handler)
    return app


@dataclass
class ExecutorLatencies:
    """One executor's samples, in seconds from just before the cancel request.

    ``observed``: until the handler saw the request; ``settled``: until
    ``app.cancellations.wait()`` returned; ``call``: until ``app.cancel(id, wait=...)``
    itself returned.
    """

    observed: list[float] = field(default_factory=list)
    settled: list[float] = field(default_factory=list)
    call: list[float] = field(default_factory=list)


async def measure(
    url: str, executor: str, samples: int, workdir: Path, settle: float, timeout: float
) -> ExecutorLatencies:
    """Take ``samples`` cancellation samples of ``executor``'s handler, one job at a time.

    A worker (:data:`CONFIG`) runs in this process, on the same App as the caller. Each
    job starts and waits; ``settle`` seconds after its ``started`` mark the clock starts
    just before ``app.cancel(id, wait=timeout)`` is started as a task; once that task has
    sent its first query, ``app.cancellations.wait(id, timeout)`` runs beside it. Not
    ``cancel(wait=0)``: that settles the record at once as ``partial`` ("still running
    after 0s") while the handler still runs, and ``wait_cancelled`` then returns that at
    once. The job must end ``cancelled``, the record ``completed`` without errors.
    """
    MARKS.clear()
    marks = workdir / "marks"
    marks.mkdir(parents=True, exist_ok=True)
    app = make_app(url)
    out = ExecutorLatencies()

    async def mark(what: str, job_id: int) -> float:
        if executor == "process":
            return await read_mark(marks, what, job_id, timeout)
        return await MARKS.wait(what, job_id, timeout)

    async def cancel(job_id: int) -> tuple[CancellationResult, float]:
        result = await app.cancel(job_id, wait=timeout)
        return result, time.perf_counter()

    try:
        worker = app.worker(CONFIG)
        await worker.start()
        try:
            args = {"marks": str(marks)} if executor == "process" else {}
            for _ in range(samples):
                job = await app.enqueue(TASKS[executor], args)
                await mark("started", job.id)
                await asyncio.sleep(settle)
                requested = time.perf_counter()
                calling = asyncio.create_task(cancel(job.id))
                await asyncio.sleep(0)  # the request's first query goes out first
                ok, errors = await app.cancellations.wait(job.id, timeout)
                settled = time.perf_counter()
                result, returned = await calling
                observed = await mark("observed", job.id)
                final = await app.wait(job.id, timeout)
                if final.state is not JobState.CANCELLED or result.outcome != "cancelled":
                    raise RuntimeError(
                        f"{executor} job {job.id} ended {final.state} ({result.outcome})"
                    )
                if not ok or result.status != "completed":
                    raise RuntimeError(
                        f"{executor} job {job.id}: cancellation {result.status}: {errors}"
                    )
                out.observed.append(observed - requested)
                out.settled.append(settled - requested)
                out.call.append(returned - requested)
        finally:
            await asyncio.wait_for(worker.stop(), 60)
    finally:
        with contextlib.suppress(Exception):
            await app.close()
    return out
