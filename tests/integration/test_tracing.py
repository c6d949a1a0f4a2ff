"""OpenTelemetry traces (``tether.otel``), read back from the SDK's in-memory exporter:
one trace from an HTTP request through an enqueue, a run that spawns a child and the
child's run, on both stores."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import tether
from tests.helpers import eventually
from tests.integration.control_support import StartWorker, rescued_job
from tether import App, JobState
from tether.auth import Tokens
from tether.hooks import Hooks
from tether.otel import Tracing
from tether.web import create_app


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    return made


def _named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def _parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_one_trace_from_an_http_request_through_a_spawned_childs_run(
    app: App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app.hooks = Hooks([Tracing(provider)])

    @app.task(name="child")
    async def child(ctx: tether.JobContext) -> str:
        return "child done"

    @app.task(name="parent")
    async def parent(ctx: tether.JobContext) -> int:
        if ctx.phase is None:
            with trace.get_tracer("user-code", tracer_provider=provider).start_as_current_span(
                "user work"
            ):
                await ctx.spawn(child)
            raise tether.WaitForChildren("collect")
        (made,) = await ctx.children()
        return made.id

    token, _ = await Tokens(app).create("root", "admin")
    # The caller's side of the request: its span's context goes out in the headers.
    caller = trace.get_tracer("caller", tracer_provider=provider)
    with caller.start_as_current_span("client request", kind=SpanKind.CLIENT) as client_span:
        headers = {"Authorization": f"Bearer {token}"}
        propagate.inject(headers)
        transport = httpx.ASGITransport(app=create_app(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://t.test") as http:
            res = await http.post("/api/jobs", json={"task": "parent"}, headers=headers)
    assert res.status_code == 201, res.text
    job_id = res.json()["id"]
    await app.run_until_idle()
    child_id = (await app.get(job_id)).result
    assert (await app.get(child_id)).state is JobState.SUCCEEDED

    spans = exporter.get_finished_spans()
    trace_id = client_span.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}, "one trace"
    # The API's span of the request (in one process with its caller, it is INTERNAL).
    (server,) = [s for s in spans if s.name == "POST /api/jobs"]
    assert _parent_of(server) == client_span.get_span_context().span_id
    (enqueue_parent,) = _named(spans, "enqueue parent")
    # Two runs of the parent (its two phases), both children of its enqueue.
    first_run, second_run = sorted(_named(spans, "run parent"), key=lambda s: s.start_time or 0)
    (user_work,) = _named(spans, "user work")
    (enqueue_child,) = _named(spans, "enqueue child")
    (run_child,) = _named(spans, "run child")
    # The enqueue happened inside the request's handling (under its server span).
    ancestors = {s.context.span_id: s for s in spans}
    up, chain = enqueue_parent, []
    while up.parent is not None and up.parent.span_id in ancestors:
        up = ancestors[up.parent.span_id]
        chain.append(up)
    assert server in chain
    assert _parent_of(first_run) == enqueue_parent.context.span_id
    assert _parent_of(second_run) == enqueue_parent.context.span_id
    assert _parent_of(user_work) == first_run.context.span_id
    assert _parent_of(enqueue_child) == user_work.context.span_id
    assert _parent_of(run_child) == enqueue_child.context.span_id
    assert enqueue_parent.kind is SpanKind.PRODUCER and first_run.kind is SpanKind.CONSUMER
    attributes = dict(run_child.attributes or {})
    assert attributes["tether.job.id"] == child_id
    assert attributes["tether.job.task"] == "child"
    assert attributes["tether.job.attempt"] == 1
    assert attributes["tether.outcome"] == "succeeded"
    # The trace context travels in the job's meta.
    assert "traceparent" in ((await app.get(child_id)).meta or {})


async def test_every_attempt_is_a_child_of_the_enqueue_and_failures_are_errors(
    app: App, provider: TracerProvider, exporter: InMemorySpanExporter, workers: StartWorker
) -> None:
    app.hooks = Hooks([Tracing(provider)])

    @app.task(name="flaky", max_attempts=2, retry=tether.RetryPolicy(base_delay=0.01))
    async def flaky(ctx: tether.JobContext) -> None:
        raise RuntimeError(f"boom {ctx.attempt}")

    many = await app.enqueue_many([(flaky, {}), (flaky, {})])
    await workers()
    assert {(await app.wait(j.id, timeout=10)).state for j in many} == {JobState.FAILED}
    spans = exporter.get_finished_spans()
    (enqueue,) = _named(spans, "enqueue flaky")
    assert dict(enqueue.attributes or {})["tether.jobs"] == 2
    runs = _named(spans, "run flaky")
    assert len(runs) == 4
    assert {_parent_of(r) for r in runs} == {enqueue.context.span_id}
    outcomes = sorted(
        (dict(r.attributes or {})["tether.job.attempt"], dict(r.attributes or {})["tether.outcome"])
        for r in runs
    )
    assert outcomes == [(1, "retrying"), (1, "retrying"), (2, "failed"), (2, "failed")]
    assert all(r.status.status_code is trace.StatusCode.ERROR for r in runs)
    assert all(any(e.name == "exception" for e in r.events) for r in runs)


async def test_cancellations_pauses_and_rescues_are_span_events(
    app: App, provider: TracerProvider, exporter: InMemorySpanExporter, workers: StartWorker
) -> None:
    app.hooks = Hooks([Tracing(provider)])
    started: dict[int, asyncio.Event] = {}

    @app.task(name="long")
    async def long(ctx: tether.JobContext) -> None:
        started.setdefault(ctx.id, asyncio.Event()).set()
        await ctx.cancelled.wait()
        raise tether.Cancelled(ctx.cancelled.reason or "stop")

    to_cancel = await long.enqueue()
    to_pause = await long.enqueue()
    not_started = await app.enqueue(long, delay=3600)
    for job in (to_cancel, to_pause):
        started.setdefault(job.id, asyncio.Event())
    await workers()
    for job in (to_cancel, to_pause):
        await asyncio.wait_for(started[job.id].wait(), 10)
    result = await app.cancel(to_cancel.id, reason="wrong input", wait=10)
    await app.jobs.pause(to_pause.id, reason="maintenance window")
    await app.cancel(not_started.id, reason="not needed")

    async def paused_now() -> bool:
        return (await app.get(to_pause.id)).state is JobState.PAUSED

    await eventually(paused_now)
    # A span ends with its attempt's handler, before the outcome is recorded.
    finished = exporter.get_finished_spans()

    def span_of(name: str, job_id: int) -> ReadableSpan:
        (found,) = [
            s
            for s in _named(finished, name)
            if dict(s.attributes or {}).get("tether.job.id") == job_id
        ]
        return found

    cancelled = span_of("run long", to_cancel.id)
    assert dict(cancelled.attributes or {})["tether.outcome"] == "cancelled"
    (event,) = [e for e in cancelled.events if e.name == "tether.cancel_requested"]
    assert dict(event.attributes or {})["tether.reason"] == "wrong input"
    assert dict(cancelled.attributes or {})["tether.reason"] == "wrong input"
    assert result.cancellation_id.startswith("cancel-")

    paused = span_of("run long", to_pause.id)
    assert dict(paused.attributes or {})["tether.outcome"] == "paused"
    (event,) = [e for e in paused.events if e.name == "tether.pause_requested"]
    assert dict(event.attributes or {})["tether.reason"] == "maintenance window"

    never_ran = span_of("cancel long", not_started.id)
    (event,) = [e for e in never_ran.events if e.name == "tether.cancelled"]
    assert dict(event.attributes or {})["tether.reason"] == "not needed"
    assert dict(event.attributes or {})["tether.cancellation.id"].startswith("cancel-")
    (enqueue,) = [
        s
        for s in _named(exporter.get_finished_spans(), "enqueue long")
        if not_started.id in dict(s.attributes or {})["tether.job.ids"]
    ]
    assert never_ran.context.trace_id == enqueue.context.trace_id


async def test_a_rescue_is_an_event_in_the_jobs_trace(
    app: App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app.hooks = Hooks([Tracing(provider)])
    async with rescued_job(app, "victim"):
        (rescue,) = _named(exporter.get_finished_spans(), "rescue victim")
        (enqueue,) = _named(exporter.get_finished_spans(), "enqueue victim")
    assert _parent_of(rescue) == enqueue.context.span_id
    (event,) = rescue.events
    assert event.name == "tether.rescued"
    assert dict(event.attributes or {})["tether.job.state"] == "retrying"
