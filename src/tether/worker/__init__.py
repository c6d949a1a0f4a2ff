"""The worker: claims jobs, runs them, keeps their leases, and stops them when asked.

One worker is one asyncio loop with a few small services:

- the claimer (:mod:`.claimer`) leases up to ``claim_batch`` jobs per round trip while
  slots are free, gradually at first if a ramp (:mod:`.ramp`) is set;
- the heartbeater (:mod:`.heartbeater`) makes one write per interval for all leases,
  flushes progress, and learns of cancel requests and lost leases; it also fences the
  worker itself when the database has been unreachable for too long;
- the completer (:mod:`.completer`) records outcomes in batches, fenced by lease token;
  what each attempt's end means (retry, fail, release) is decided in :mod:`.outcome`;
- the handler threads (:mod:`.threads`) run thread handlers and account for the
  abandoned ones that still hold a pool thread;
- the maintenance services (:func:`tether.maintenance.build_maintenance`, one unit):
  on the maintenance leader they rescue other workers' zombie jobs, follow up
  cancellations, prune, fire schedules and release pending workflow steps.

:class:`Worker` (:mod:`.worker`) composes them. The parts never hold the worker: each
gets its narrow port (:mod:`.ports`) and callables for what it needs of its siblings.

No task per job is spent on heartbeats, nor on waiting for the handler: an async
handler is the job's only task, and everything after it runs in callbacks. A slot is
free once its handler has ended; the outcome is written while the next job already
runs.
"""

from tether.worker.claimer import Claimer
from tether.worker.completer import Completer
from tether.worker.heartbeater import Heartbeater
from tether.worker.outcome import ERROR_LIMIT
from tether.worker.ramp import Ramp
from tether.worker.run import Run
from tether.worker.threads import EXIT_RESTART, SPARE_THREADS, HandlerThreads
from tether.worker.worker import Worker

__all__ = [
    "ERROR_LIMIT",
    "EXIT_RESTART",
    "SPARE_THREADS",
    "Claimer",
    "Completer",
    "HandlerThreads",
    "Heartbeater",
    "Ramp",
    "Run",
    "Worker",
]
