"""What hooks and tracing cost per job: enqueue and drain, with and without them.

``python bench/hooks.py`` enqueues ``--jobs`` no-op jobs one call at a time (timed), then
drains them with one in-process worker at tether's defaults (timed), three ways on each
store, in interleaved rounds (median of ``--repeat`` after a warm-up):

- ``none``: no hooks (the baseline);
- ``hook``: one hook overriding all three methods, doing nothing but calling on;
- ``tracing``: :class:`tether.otel.Tracing` with the OpenTelemetry SDK, its spans batched
  to an exporter that drops them (the SDK's own cost, not an exporter's network).

It prints the time each adds per job to an enqueue and to a job's run (from enqueue of
the first job to the last one's success). On PostgreSQL it runs in a private throwaway
cluster (``fsync = off``), never the shared server. Compare rows with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.private_pg import private_postgres

from tether import App, Enqueueing, Hook, Job, JobContext, OutcomeEvent, WorkerConfig
from tether.otel import Tracing

MODES = ("none", "hook", "tracing")


class Passing(Hook):
    """A hook on every moment that only calls on."""

    async def enqueue(
        self, jobs: Sequence[Enqueueing], call_next: Callable[[], Awaitable[list[Job]]]
    ) -> list[Job]:
        return await call_next()

    async def execute(self, ctx: JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        return await call_next()

    async def outcome(self, event: OutcomeEvent) -> None:
        return None


class Dropping(SpanExporter):
    """Exports nothing: the SDK's cost without an exporter's."""

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def build(url: str, mode: str) -> tuple[App, TracerProvider | None]:
    provider = None
    hooks: list[Hook] = []
    if mode == "hook":
        hooks = [Passing()]
    elif mode == "tracing":
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropping()))
        hooks = [Tracing(provider)]
    app = App(url, hooks=hooks)

    @app.task(name="noop")
    async def noop(ctx: JobContext) -> None:
        return None

    return app, provider


async def run(url: str, mode: str, jobs: int) -> tuple[float, float]:
    """Seconds to enqueue ``jobs`` jobs one by one, and to drain them."""
    app, provider = build(url, mode)
    try:
        await app.admin.migrate()
        started = time.perf_counter()
        for _ in range(jobs):
            await app.enqueue("noop")
        enqueued = time.perf_counter() - started
        worker = app.worker(WorkerConfig())
        started = time.perf_counter()
        await worker.start()
        try:
            while True:
                if (await app.jobs.stats())["succeeded"] >= jobs:
                    break
                await asyncio.sleep(0.05)
        finally:
            await worker.stop()
        return enqueued, time.perf_counter() - started
    finally:
        await app.close()
        if provider is not None:
            provider.shutdown()


async def measure(name: str, make_url: Callable[[str], str], args: argparse.Namespace) -> list[str]:
    """One store's rows of the table."""
    enq: dict[str, list[float]] = {m: [] for m in MODES}
    drain: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.repeat + 1):  # the first round warms up, untimed
        for mode in MODES[r % 3 :] + MODES[: r % 3]:
            e, d = await run(make_url(f"{mode}{r}"), mode, args.jobs)
            if r > 0:
                enq[mode].append(e)
                drain[mode].append(d)
    e0, d0 = statistics.median(enq["none"]), statistics.median(drain["none"])
    rows = []
    for mode in MODES:
        e, d = statistics.median(enq[mode]), statistics.median(drain[mode])
        added = "" if mode == "none" else f"{(e - e0) / args.jobs * 1e6:,.0f}"
        added_run = "" if mode == "none" else f"{(d - d0) / args.jobs * 1e6:,.0f}"
        rows.append(
            f"| {name} | {mode} | {args.jobs / e:,.0f} | {added} | {args.jobs / d:,.0f} | "
            f"{added_run} |"
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per round (2000)")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds (3)")
    args = parser.parse_args()
    print(
        f"{args.jobs} no-op jobs, enqueued one by one, drained by one in-process worker at "
        f"the defaults; median of {args.repeat} interleaved rounds after a warm-up\n"
    )
    print(
        "| store | hooks | enqueues/s | µs added per enqueue | jobs/s drained | "
        "µs added per job run |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        rows = await measure("sqlite", lambda tag: f"sqlite:///{tmp}/{tag}.db", args)
    print("\n".join(rows), flush=True)
    with private_postgres("hooks") as pg_url:
        rows = await measure("postgresql", pg_url, args)
    print("\n".join(rows))


if __name__ == "__main__":
    asyncio.run(main())
