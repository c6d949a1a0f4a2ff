"""OpenTelemetry traces for tether: the ``tether[otel]`` extra.

Tracing is off unless the extra is installed and the App is given the hook::

    import tether
    from tether.otel import Tracing

    app = tether.App(url, hooks=[Tracing()])

Then:

- every enqueue records a ``PRODUCER`` span (``enqueue <task>``) under the caller's
  current span, and each job it writes carries that span's W3C trace context in its
  ``meta`` (``traceparent``, ``tracestate``), through ``enqueue_many``, workflows,
  ``ctx.spawn`` and every retry;
- every attempt is a ``CONSUMER`` span (``run <task>``), a child of its enqueue's span
  whichever worker runs it, with the job's id, task, queue, attempt and outcome, and,
  when it was cancelled or paused, the request's reason and cancellation record. The
  handler runs inside it, so spans the handler makes (and the enqueues of the children
  it spawns) are its children;
- a cancel or pause request reaching a running attempt is an event on its span; a job
  cancelled before it ran, or rescued from a dead worker, gets a short span of its own in
  the job's trace with that event;
- the REST API (``tether serve``) continues the trace of an incoming ``traceparent``
  header when its App traces.

Spans go to the global tracer provider unless one is given; configure the SDK and an
exporter (OTLP, say) as for any other service.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError("tether.otel needs OpenTelemetry: pip install 'tether[otel]'") from exc

from tether.durable import Parked
from tether.errors import Cancelled, Fail
from tether.hooks import Enqueueing, Hook, OutcomeEvent

if TYPE_CHECKING:
    from tether.context import JobContext
    from tether.job import Job

#: The meta keys the trace context travels in (W3C Trace Context).
CONTEXT_KEYS = ("traceparent", "tracestate")


def _short(task: str) -> str:
    return task.rsplit(".", 1)[-1]


def _job_attributes(job: Job) -> dict[str, Any]:
    return {
        "tether.job.id": job.id,
        "tether.job.task": job.task,
        "tether.job.queue": job.queue,
        "tether.job.attempt": job.attempt,
        "messaging.system": "tether",
    }


def _parent(meta: Mapping[str, str] | None) -> Any:
    """The trace context a job carries (an empty one when it carries none)."""
    return propagate.extract({k: v for k, v in (meta or {}).items() if k in CONTEXT_KEYS})


class Tracing(Hook):
    """The hook that traces enqueues and attempts (see :mod:`tether.otel`)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        from tether import __version__

        #: The provider spans go to (``None``: the global one).
        self.tracer_provider = tracer_provider
        self.tracer = trace.get_tracer("tether", __version__, tracer_provider=tracer_provider)

    async def enqueue(
        self, jobs: Sequence[Enqueueing], call_next: Callable[[], Awaitable[list[Job]]]
    ) -> list[Job]:
        """A span around the enqueue; each job carries its context."""
        tasks = sorted({_short(j.task) for j in jobs})
        name = f"enqueue {tasks[0]}" if len(tasks) == 1 else "enqueue"
        with self.tracer.start_as_current_span(name, kind=SpanKind.PRODUCER) as span:
            span.set_attribute("tether.jobs", len(jobs))
            span.set_attribute("tether.job.tasks", [j.task for j in jobs][:50])
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            for job in jobs:
                job.meta.update({k: v for k, v in carrier.items() if k in CONTEXT_KEYS})
            made = await call_next()
            span.set_attribute("tether.job.ids", [j.id for j in made][:50])
            return made

    async def execute(self, ctx: JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        """The attempt's span, a child of its enqueue's, with the handler inside."""
        job = ctx.job
        with self.tracer.start_as_current_span(
            f"run {_short(job.task)}",
            context=_parent(job.meta),
            kind=SpanKind.CONSUMER,
            attributes=_job_attributes(job),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            with _requests_as_events(ctx, span) as requested:
                try:
                    value = await call_next()
                except BaseException as exc:
                    await _described(ctx)
                    _ended(span, ctx, exc, requested)
                    raise
            await _described(ctx)
            _ended(span, ctx, None, requested)
            return value

    async def outcome(self, event: OutcomeEvent) -> None:
        """A job cancelled before it ran, or rescued, gets a span with that event."""
        if event.kind == "cancelled" and event.job.stopped_by is None:
            name, what = "cancel", "tether.cancelled"
        elif event.kind == "rescued":
            name, what = "rescue", "tether.rescued"
        else:
            return  # the attempt's own span tells the rest
        job = event.job
        with self.tracer.start_as_current_span(
            f"{name} {_short(job.task)}",
            context=_parent(job.meta),
            kind=SpanKind.INTERNAL,
            attributes=_job_attributes(job),
        ) as span:
            attributes = {"tether.job.state": job.state.value}
            if event.reason:
                attributes["tether.reason"] = event.reason
            if event.cancellation_id:
                attributes["tether.cancellation.id"] = event.cancellation_id
            span.add_event(what, attributes)
            span.set_attribute("tether.outcome", job.state.value)


#: How long an attempt's span waits, once its handler ended on a cancel or pause
#: request, for the worker to read the request's reason and record (one query).
DESCRIBED_WAIT = 1.0


async def _described(ctx: JobContext) -> None:
    if ctx.cancelled.reason in ("cancel", "pause") and ctx.cancelled.detail is None:
        await ctx.cancelled.described(DESCRIBED_WAIT)


@contextlib.contextmanager
def _requests_as_events(ctx: JobContext, span: trace.Span) -> Iterator[list[int]]:
    """Note when the attempt is asked to stop (cancel, pause, the worker's shutdown, a
    lost lease); :func:`_ended` adds the event, stamped then, with what is known."""
    requested: list[int] = []

    async def watch() -> None:
        await ctx.cancelled.wait()
        requested.append(time.time_ns())

    watcher = asyncio.ensure_future(watch())
    try:
        yield requested
    finally:
        watcher.cancel()


def _stop_attributes(ctx: JobContext) -> dict[str, Any]:
    signal = ctx.cancelled
    attributes: dict[str, Any] = {}
    if signal.detail:
        attributes["tether.reason"] = signal.detail
    if signal.cancellation_id:
        attributes["tether.cancellation.id"] = signal.cancellation_id
    return attributes


def _ended(
    span: trace.Span, ctx: JobContext, exc: BaseException | None, requested: list[int]
) -> None:
    """The attempt's outcome on its span, as the handler's end will be recorded."""
    job, stop = ctx.job, ctx.cancelled.reason
    if stop is not None:
        span.add_event(
            f"tether.{stop}_requested",
            _stop_attributes(ctx),
            timestamp=requested[0] if requested else None,
        )
    if stop in ("cancel", "pause", "shutdown", "lease_lost"):
        outcome = {"cancel": "cancelled", "pause": "paused", "shutdown": "released"}.get(
            stop, "lease_lost"
        )
        span.set_attributes(_stop_attributes(ctx))
    elif exc is None:
        outcome = "succeeded"
    elif isinstance(exc, Cancelled | asyncio.CancelledError):
        outcome = "cancelled"
    elif isinstance(exc, Parked):
        outcome = "parked"  # a durable sleep or wait: the job goes on later
    elif isinstance(exc, Fail) or job.attempt >= job.max_attempts:
        outcome = "failed"
    else:
        outcome = "retrying"
    span.set_attribute("tether.outcome", outcome)
    if outcome in ("failed", "retrying") and exc is not None:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200]))


__all__ = ["CONTEXT_KEYS", "Tracing"]
