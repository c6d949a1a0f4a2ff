"""Prometheus metrics: counters and histograms the core updates, and a scrape-time view.

The core calls the small functions below at the moments that matter (a cancellation
ends, a job starts, a lease is lost); each process exposes its own counts. The API server
serves them at ``/metrics`` together with gauges read from the database at scrape time
(jobs by state and queue, paused queues, workers by state); a worker serves its own with
``tether worker --metrics-port``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tether.job import Job, Outcome, QueueInfo, Unserved, WorkerInfo

if TYPE_CHECKING:
    from tether.app import App
    from tether.cancellation import CancellationSummary

__all__ = ["CONTENT_TYPE_LATEST", "render", "serve"]

# Cancellations take from milliseconds (not running) to the kill timeout and beyond.
CANCEL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Jobs wait and run from milliseconds to hours.
JOB_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)

HOOK_ERRORS = Counter(
    "tether_hook_errors_total",
    "Hooks that raised (or swallowed an error); the job went on without them.",
    ["hook", "phase"],
)
CANCELLATION_REQUESTS = Counter(
    "tether_cancellation_requests_total", "Cancellation requests received.", ["force"]
)
CANCELLATION_DURATION = Histogram(
    "tether_cancellation_duration_seconds",
    "From a cancellation's request to its settled record.",
    ["status"],
    buckets=CANCEL_BUCKETS,
)
CANCELLATION_FAILURES = Counter(
    "tether_cancellation_failures_total",
    "Cancellations that ended partial or failed.",
    ["status"],
)
RUNNERS_TERMINATED = Counter(
    "tether_runners_terminated_total", "Running handlers stopped by cancellations."
)
RESOURCES_CLEANED = Counter(
    "tether_resources_cleaned_total",
    "Concurrency-key and resource slots released by cancellations.",
)
START_LATENCY = Histogram(
    "tether_job_start_latency_seconds",
    "From enqueue to the first attempt's start (includes a delay asked for at enqueue).",
    ["queue"],
    buckets=JOB_BUCKETS,
)
RUN_DURATION = Histogram(
    "tether_job_run_duration_seconds",
    "How long one attempt ran on this worker, by how it ended.",
    ["task", "outcome"],
    buckets=JOB_BUCKETS,
)
ZOMBIES_RESCUED = Counter(
    "tether_zombies_rescued_total", "Running jobs whose lease had expired, handed back."
)
LEASE_LOSSES = Counter(
    "tether_lease_losses_total", "Attempts this worker stopped because it lost their lease."
)
HEARTBEAT_FAILURES = Counter("tether_heartbeat_failures_total", "Heartbeat writes that failed.")
PRUNED = Counter(
    "tether_pruned_total",
    "Rows the retention pruner deleted, by kind (jobs, events, audit, workers, ...).",
    ["kind"],
)
STEPS = Counter(
    "tether_steps_total",
    "Durable steps by task and what became of them: ran (and recorded) or replayed "
    "(an earlier attempt's result returned without running it).",
    ["task", "outcome"],
)
WAITS = Counter(
    "tether_waits_total",
    "Sleeps and waits for signals (kind), by outcome: parked (the job gave back its "
    "lease), done (over, or the signal was in), timed_out, or lost (lease lost).",
    ["kind", "outcome"],
)
SCHEDULED = Counter(
    "tether_scheduled_jobs_total", "Jobs this process enqueued for periodic schedules."
)
SCHEDULE_TICKS_SKIPPED = Counter(
    "tether_schedule_ticks_skipped_total",
    "Schedule ticks this process skipped: more than their grace late (no scheduler ran).",
)
FORCE_KILLS = Counter(
    "tether_force_kills_total",
    "Handlers stopped at once (force cancel, timeout, lost lease, second stop).",
    ["executor"],
)
ABANDONED_THREADS = Gauge(
    "tether_abandoned_threads",
    "Handler threads abandoned (they ignored being stopped) that still run in this process.",
)
THREAD_POOLS_FULL = Gauge(
    "tether_thread_pool_exhausted",
    "Workers in this process whose thread pool is full of abandoned threads: they claim "
    "no thread jobs until one ends or the worker restarts.",
)
HTTP_REQUESTS = Counter(
    "tether_http_requests_total", "API requests answered.", ["method", "route", "status"]
)

# -- what the core calls -----------------------------------------------------------------


def cancellation_requested(force: bool) -> None:
    """A cancel request arrived."""
    CANCELLATION_REQUESTS.labels(force=str(force).lower()).inc()


def cancellation_finished(status: str, result: CancellationSummary) -> None:
    """A cancellation settled; ``result`` is its record's result."""
    CANCELLATION_DURATION.labels(status=status).observe(result.duration_seconds or 0.0)
    if status != "completed":
        CANCELLATION_FAILURES.labels(status=status).inc()
    RUNNERS_TERMINATED.inc(len(result.runners_terminated or ()))
    RESOURCES_CLEANED.inc(len(result.slots_released or ()))


# Looking a labelled child up costs more than observing it; these run once per job.
@functools.cache
def _start_latency(queue: str) -> Histogram:
    return START_LATENCY.labels(queue=queue)


@functools.cache
def _run_duration(task: str, outcome: str) -> Histogram:
    return RUN_DURATION.labels(task=task, outcome=outcome)


def job_started(job: Job) -> None:
    """A worker launched an attempt (database times on both ends)."""
    if job.attempt == 1 and job.started_at is not None:
        seconds = (job.started_at - job.created_at).total_seconds()
        _start_latency(job.queue).observe(max(0.0, seconds))


def job_ran(task: str, outcome: Outcome | None, seconds: float, *, parked: bool = False) -> None:
    """An attempt ended on this worker, asking for ``outcome`` (``None``: lease lost, or
    ``parked`` by a sleep or a wait)."""
    ended = outcome.state.value if outcome is not None else "parked" if parked else "lease_lost"
    _run_duration(task, ended).observe(seconds)


def hook_failed(hook: str, phase: str) -> None:
    """A hook raised (or swallowed an error) in ``phase``; the job went on without it."""
    HOOK_ERRORS.labels(hook, phase).inc()


def zombies_rescued(count: int) -> None:
    """The rescuer handed back ``count`` jobs."""
    if count:
        ZOMBIES_RESCUED.inc(count)


def step_ran(task: str, outcome: str) -> None:
    """A durable step ``ran`` or was ``replayed``."""
    STEPS.labels(task, outcome).inc()


def waited(kind: str, outcome: str) -> None:
    """A sleep or a wait for a signal (``kind``) ended this way."""
    WAITS.labels(kind, outcome).inc()


def pruned(kind: str, count: int) -> None:
    """The pruner deleted ``count`` rows of ``kind``."""
    if count:
        PRUNED.labels(kind).inc(count)


def lease_lost() -> None:
    """This worker stopped an attempt, or dropped its outcome, because its lease was gone."""
    LEASE_LOSSES.inc()


def heartbeat_failed() -> None:
    """A heartbeat write failed."""
    HEARTBEAT_FAILURES.inc()


def handler_stopped(executor: str, force: bool) -> None:
    """A worker stopped a handler; only a forced stop counts."""
    if force:
        FORCE_KILLS.labels(executor=executor).inc()


def threads_abandoned(change: int) -> None:
    """Abandoned handler threads began (``+n``) or ended (``-n``)."""
    ABANDONED_THREADS.inc(change)


def thread_pool_full(full: bool) -> None:
    """A worker's thread pool became full of abandoned threads, or has room again."""
    THREAD_POOLS_FULL.inc(1 if full else -1)


def http_request(method: str, route: str, status: int) -> None:
    """The API answered a request (``route`` is the path template, not the path)."""
    HTTP_REQUESTS.labels(method=method, route=route, status=str(status)).inc()


# -- exposing ----------------------------------------------------------------------------


class _Snapshot(Collector):
    """Gauges from one read of the database, taken just before a scrape."""

    def __init__(
        self,
        queues: list[QueueInfo],
        workers: list[WorkerInfo],
        unserved: list[Unserved] | None = None,
    ) -> None:
        self.queues = queues
        self.workers = workers
        self.unserved = unserved or []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "tether_jobs", "Jobs by queue and state.", labels=["queue", "state"]
        )
        paused = GaugeMetricFamily(
            "tether_queue_paused", "1 if the queue is paused.", labels=["queue"]
        )
        for q in self.queues:
            for state, n in sorted(q.counts.items()):
                jobs.add_metric([q.name, state], n)
            paused.add_metric([q.name], 1.0 if q.paused else 0.0)
        workers = GaugeMetricFamily("tether_workers", "Workers by state.", labels=["state"])
        by_state: dict[str, int] = {}
        for w in self.workers:
            by_state[w.state] = by_state.get(w.state, 0) + 1
        for state, n in sorted(by_state.items()):
            workers.add_metric([state], n)
        unserved = GaugeMetricFamily(
            "tether_jobs_unserved",
            "Waiting jobs that no live worker can run (no worker serves their task on "
            "their queue).",
            labels=["queue", "task"],
        )
        for u in self.unserved:
            unserved.add_metric([u.queue, u.task], u.jobs)
        yield from (jobs, paused, workers, unserved)


async def render(app: App) -> bytes:
    """This process's metrics plus the database gauges, in the text exposition format."""
    snapshot = CollectorRegistry(auto_describe=False)
    queues = await app.queues.list()  # each carries its unserved tasks: no second scan
    unserved = [u for q in queues for u in q.unserved]
    snapshot.register(_Snapshot(queues, await app.admin.workers(), unserved))
    return generate_latest(REGISTRY) + generate_latest(snapshot)


_served: dict[tuple[str, int], Any] = {}
_serve_lock = threading.Lock()


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose this process's metrics over HTTP (a worker's ``--metrics-port``)."""
    with _serve_lock:
        if (host, port) not in _served:
            _served[(host, port)] = start_http_server(port, addr=host)
