"""The tether app that the benchmark's worker processes run, and the marks they leave.

``bench/run.py`` imports this module for its in-process workers and starts it as a script
for its worker subprocesses::

    python bench/workerapp.py sqlite:////tmp/x/tether.db --marks /tmp/x/marks

Its tasks stand in for real work:

- ``bench.hang``: hangs on attempt 1 (the crash-recovery benchmark kills its worker then);
  any later attempt returns at once;
- ``bench.wait_cancel``: waits on ``ctx.cancelled`` and raises ``Cancelled`` once it is set
  (the cancellation-latency benchmark);
- ``bench.sleep``: ``asyncio.sleep(seconds)`` (the memory benchmark);
- ``bench.noop``: returns at once (the scaling benchmark's drain).

Handlers record the moments that matter (``started``, ``observed``, ``restarted``) with
``time.perf_counter()`` in :data:`MARKS`. ``perf_counter`` is ``CLOCK_MONOTONIC`` on Linux,
shared by every process on the host, so with ``--marks DIR`` a mark written by a worker
process can be compared with a clock read in the benchmark process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from tether import App, JobContext, WorkerConfig

HANG = "bench.hang"
WAIT_CANCEL = "bench.wait_cancel"
SLEEP = "bench.sleep"
NOOP = "bench.noop"

#: How long ``bench.hang`` hangs on its first attempt: far longer than any benchmark.
HANG_SECONDS = 3600.0


class Marks:
    """Moments that handlers reach, by ``(what, job id)``, as ``perf_counter`` readings.

    In-process waiters use :meth:`wait`. With ``directory`` set, each mark is also written
    to a file ``{what}-{job id}`` there (atomically), for :func:`read_mark` in another
    process.
    """

    def __init__(self) -> None:
        self.times: dict[tuple[str, int], float] = {}
        self.directory: Path | None = None
        self._events: dict[tuple[str, int], asyncio.Event] = {}

    def mark(self, what: str, job_id: int) -> float:
        """Record that job ``job_id`` reached ``what`` now; return the reading."""
        now = time.perf_counter()
        key = (what, job_id)
        self.times[key] = now
        event = self._events.get(key)
        if event is not None:
            event.set()
        if self.directory is not None:
            final = self.directory / f"{what}-{job_id}"
            tmp = final.with_suffix(".tmp")
            tmp.write_text(repr(now), encoding="ascii")
            os.replace(tmp, final)
        return now

    async def wait(self, what: str, job_id: int, timeout: float) -> float:
        """The reading of mark ``(what, job_id)``, waiting up to ``timeout`` seconds for it.

        Raises ``TimeoutError``. Call from the event loop the handlers run on.
        """
        key = (what, job_id)
        if key not in self.times:
            event = self._events.setdefault(key, asyncio.Event())
            await asyncio.wait_for(event.wait(), timeout)
        return self.times[key]

    def clear(self) -> None:
        """Forget every mark (job ids restart from 1 in each fresh database)."""
        self.times.clear()
        self._events.clear()


MARKS = Marks()


async def read_mark(directory: Path, what: str, job_id: int, timeout: float) -> float:
    """Wait for another process's mark file and return its reading.

    The file is polled every 2 ms; the figure is the reading inside the file, so the
    polling period does not add to it. Raises ``TimeoutError``.
    """
    path = directory / f"{what}-{job_id}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            return float(path.read_text(encoding="ascii"))
        if loop.time() > deadline:
            raise TimeoutError(f"no {what!r} mark for job {job_id} within {timeout:g} s")
        await asyncio.sleep(0.002)


def make_app(url: str) -> App:
    """An App on ``url`` with the benchmark's tasks registered."""
    app = App(url)

    @app.task(name=HANG)
    async def hang(ctx: JobContext) -> None:
        """Hang on attempt 1; return at once on any later attempt."""
        if ctx.attempt == 1:
            MARKS.mark("started", ctx.id)
            await asyncio.sleep(HANG_SECONDS)
            return
        MARKS.mark("restarted", ctx.id)

    @app.task(name=WAIT_CANCEL)
    async def wait_cancel(ctx: JobContext) -> None:
        """Wait for the cancel signal, note when it came, and stop as asked."""
        MARKS.mark("started", ctx.id)
        await ctx.cancelled.wait()
        MARKS.mark("observed", ctx.id)
        ctx.check_cancelled()

    @app.task(name=SLEEP)
    async def sleep(ctx: JobContext, seconds: float = 60.0) -> None:
        """Sleep; stands in for a job waiting on I/O."""
        await asyncio.sleep(seconds)

    @app.task(name=NOOP)
    async def noop(ctx: JobContext) -> None:
        """Nothing: a drain measures the queue, not the work."""

    return app


def main(argv: list[str] | None = None) -> int:
    """Run one worker until SIGTERM/SIGINT; unset options keep WorkerConfig's defaults."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url", help="the database URL")
    parser.add_argument("--marks", type=Path, help="directory to write mark files into")
    parser.add_argument("--concurrency", type=int, help="WorkerConfig.concurrency")
    parser.add_argument("--claim-batch", type=int, help="WorkerConfig.claim_batch")
    parser.add_argument("--stop-timeout", type=float, help="WorkerConfig.stop_timeout")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, format="worker %(process)d %(name)s: %(message)s")
    if args.marks is not None:
        args.marks.mkdir(parents=True, exist_ok=True)
        MARKS.directory = args.marks
    settings = {
        "concurrency": args.concurrency,
        "claim_batch": args.claim_batch,
        "stop_timeout": args.stop_timeout,
    }
    config = WorkerConfig(**{k: v for k, v in settings.items() if v is not None})
    app = make_app(args.url)

    async def run() -> None:
        try:
            await app.worker(config).run(handle_signals=True)
        finally:
            await app.close()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
