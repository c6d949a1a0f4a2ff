"""One system's consumer in a process of its own, as a user would run it.

``bench/run.py`` starts this script once per consumer process of a drain::

    python bench/consumers.py tether URL --concurrency 200 --claim-batch 50
    python bench/consumers.py pgqueuer DSN --batch-size 100
    python bench/consumers.py procrastinate DSN --concurrency 10
    python bench/consumers.py huey PATH --workers 8 --synchronous normal

The jobs are already in the database. Each process imports its library, connects and
sets up, prints ``ready`` on stdout and waits for a line on stdin, so that the clock of
the drain leaves interpreter start-up out and can release every process of a drain at
once. It then consumes until SIGTERM and, on its way out, prints ``ran N``: how many
times its no-op handler ran, which the harness adds up to check that every job ran
exactly once. The harness itself knows the drain is over from the database alone (a
count of finished rows, see ``bench/drain.py``), never from a signal of this process.

Each consumer is the library's own, run the way its documentation runs it: tether's
``Worker.run(handle_signals=True)`` (what ``tether worker`` runs); one PgQueuer
``QueueManager`` on its own asyncpg connection, ``run(batch_size=...)``; Procrastinate's
``run_worker_async`` with its signal handlers; huey's ``Consumer.run()`` with thread
workers and its signal handlers (what ``huey_consumer -k thread`` runs). Logging is at
WARNING for all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import peers
from tether import App, JobContext, WorkerConfig
from tether.config import AppConfig, RetentionConfig

#: The task name of tether's no-op job (``bench/workerapp.py`` registers it too).
NOOP = "bench.noop"
#: Retention that prunes nothing: the drain beside a million finished jobs keeps them.
NO_PRUNING = AppConfig(
    retention=RetentionConfig(succeeded=None, failed=None, cancelled=None, audit=None, workers=None)
)

#: Counts the no-op handler's calls: ``next`` on it is atomic, also across huey's threads,
#: and after N calls the next ``next`` gives N.
_RAN = itertools.count()


def _noop_ran() -> None:
    next(_RAN)


async def _ready_then_wait() -> None:
    """Tell the harness this process is set up, then wait for its go (a line on stdin)."""
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)


def _wait_for_go() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


async def _tether(url: str, config: WorkerConfig, keep_finished: bool) -> None:
    app = App(url, config=NO_PRUNING if keep_finished else None)

    @app.task(name=NOOP)
    async def noop(ctx: JobContext) -> None:
        _noop_ran()

    try:
        await app.store()  # connect, and migrate if needed
        await _ready_then_wait()
        await app.worker(config).run(handle_signals=True)
    finally:
        await app.close()


async def _pgqueuer(dsn: str, batch_size: int) -> None:
    from pgqueuer import Queries, QueueManager
    from pgqueuer.models import Job

    async with peers.pgq_driver(dsn, peers.PGQ_DRIVER) as driver:
        qm = QueueManager(Queries(driver))

        @qm.entrypoint(peers.NOOP, accepts_context=False)
        async def noop(job: Job) -> None:
            _noop_ran()

        await _ready_then_wait()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, qm.shutdown.set)
        await qm.run(batch_size=batch_size)


async def _procrastinate(dsn: str, concurrency: int) -> None:
    app = peers.procrastinate_app(dsn, concurrency)

    @app.task(name=peers.NOOP)
    async def noop() -> None:
        _noop_ran()

    async with app.open_async():
        await _ready_then_wait()
        await app.run_worker_async(
            concurrency=concurrency, install_signal_handlers=True, listen_notify=True
        )


def _huey(path: str, workers: int, synchronous: str) -> None:
    from huey.consumer import Consumer  # type: ignore[import-untyped]

    huey = peers.huey_instance(path, synchronous)
    peers.huey_noop(huey, _noop_ran)
    consumer = Consumer(huey, workers=workers, worker_type="thread")
    _wait_for_go()
    # Installs huey's own handlers: SIGTERM stops at once, SIGINT gracefully.
    consumer.run()


def main(argv: list[str] | None = None) -> int:
    """Run one consumer until SIGTERM; print ``ready`` first and ``ran N`` last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="system", required=True)
    p = sub.add_parser("tether", help="a tether worker")
    p.add_argument("url")
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--claim-batch", type=int, required=True)
    p.add_argument("--keep-finished", action="store_true", help="prune nothing")
    p = sub.add_parser("pgqueuer", help="one PgQueuer QueueManager")
    p.add_argument("dsn")
    p.add_argument("--batch-size", type=int, default=peers.PGQ_BATCH_SIZE)
    p = sub.add_parser("procrastinate", help="one Procrastinate worker")
    p.add_argument("dsn")
    p.add_argument("--concurrency", type=int, default=peers.PROCRASTINATE_CONCURRENCY)
    p = sub.add_parser("huey", help="huey's consumer, thread workers")
    p.add_argument("path")
    p.add_argument("--workers", type=int, default=peers.HUEY_WORKERS)
    p.add_argument("--synchronous", choices=["normal", "full"], required=True)
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, format="%(process)d %(name)s: %(message)s")
    run: Callable[[], Coroutine[Any, Any, None]] | None = None
    if args.system == "tether":
        config = WorkerConfig(concurrency=args.concurrency, claim_batch=args.claim_batch)
        run = lambda: _tether(args.url, config, args.keep_finished)  # noqa: E731
    elif args.system == "pgqueuer":
        run = lambda: _pgqueuer(args.dsn, args.batch_size)  # noqa: E731
    elif args.system == "procrastinate":
        run = lambda: _procrastinate(args.dsn, args.concurrency)  # noqa: E731
    if run is not None:
        asyncio.run(run())
    else:
        _huey(args.path, args.workers, args.synchronous)
    print(f"ran {next(_RAN)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
