"""Workflow cascades: cancelling a 10,000-job graph, and releasing 1,000 dependents.

``bench/run.py`` imports this module; each function measures one round on a database
of its own (the caller makes it fresh).

- :func:`cascade`: a root job and a wide tree of dependents (root -> ``children`` jobs
  -> ``fanout`` jobs each), enqueued with ``app.enqueue_workflow`` (one transaction,
  untimed); no worker runs, so the root is ``queued`` and everything else ``blocked``.
  The figure is the duration of ``app.cancel(root, wait=CASCADE_WAIT)``; every job of
  the graph must then be ``cancelled`` and the cancellation record ``completed``. The
  store's ``request_cancel`` (the transaction that cancels the whole graph) is also
  timed on its own, by wrapping the method on this App's store instance: the rest of
  the call is the cancellation service reading the targets and writing its record.
- :func:`release`: a job A and ``dependents`` jobs that each depend on A alone, on a
  queue no worker serves (so they stay ``queued`` once released). A worker in this
  process serves A's queue only. A's handler reads ``perf_counter()`` just before it
  returns; the store's ``finish`` call (the one transaction that records A's success
  and, in it, queues its dependents: PostgreSQL's statement trigger, the SQLite store's
  ``_propagate``) is timed by wrapping the method on this App's store instance. Two
  figures: the ``finish`` call alone, and from A's return until ``finish`` has returned
  (the dependents are committed ``queued`` by then). A plain job without dependents is
  run the same way afterwards, as the baseline ``finish``. All dependents must then be
  ``queued`` and A ``succeeded``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tether import App, JobContext, JobState, WorkerConfig, Workflow
from tether.job import Finished, Job, Outcome

NODE = "bench.graph_node"
UPSTREAM = "bench.graph_upstream"
#: The queue of A and the baseline job: the only one the release worker serves.
RUN_QUEUE = "bench-graph-run"
#: The dependents' queue: no worker serves it, so released jobs stay ``queued``.
HELD_QUEUE = "bench-graph-held"
#: The ``wait`` of the timed cancel; nothing runs, so it never has to wait.
CASCADE_WAIT = 5.0
#: The release worker: only A's queue, default settings otherwise.
RELEASE_CONFIG = WorkerConfig(queues=(RUN_QUEUE,), concurrency=2)


@dataclass(frozen=True)
class CascadeRun:
    """One cancellation of a whole graph."""

    jobs: int
    cancel_s: float
    #: Of ``cancel_s``: the store's ``request_cancel`` call, the one transaction that
    #: cancels the root and everything downstream.
    transaction_s: float
    enqueue_s: float
    status: str
    cancelled: int


@dataclass(frozen=True)
class ReleaseRun:
    """One release of ``dependents`` blocked jobs by their dependency's success."""

    dependents: int
    finish_s: float
    end_to_end_s: float
    baseline_finish_s: float
    queued: int


def make_app(url: str) -> App:
    """An App on ``url`` with the graph tasks registered."""
    app = App(url)

    @app.task(name=NODE, queue=HELD_QUEUE)
    async def node(ctx: JobContext) -> None:
        """A graph node; never runs in these measurements."""

    @app.task(name=UPSTREAM, queue=RUN_QUEUE)
    async def upstream(ctx: JobContext) -> None:
        """Note the moment just before returning."""
        RETURNED[ctx.id] = time.perf_counter()

    return app


#: ``perf_counter()`` readings taken just before ``bench.graph_upstream`` returns.
RETURNED: dict[int, float] = {}


def tree(children: int, fanout: int) -> Workflow:
    """A root, ``children`` jobs depending on it, and ``fanout`` jobs depending on each."""
    wf = Workflow()
    wf.add("root", NODE)
    for c in range(children):
        child = wf.add(f"c{c}", NODE, depends_on=["root"])
        for g in range(fanout):
            wf.add(f"c{c}.{g}", NODE, depends_on=[child])
    return wf


async def cascade(url: str, children: int, fanout: int) -> CascadeRun:
    """Time ``app.cancel(root, wait=CASCADE_WAIT)`` on a fresh graph; see the module doc."""
    app = make_app(url)
    try:
        store = await app.store()  # migrate before the clock
        calls: list[float] = []
        request_cancel = store.request_cancel

        async def timed_request_cancel(
            job_id: int, reason: str | None, force: bool, actor: str | None, cascade: bool = True
        ) -> Job:
            start = time.perf_counter()
            try:
                return await request_cancel(job_id, reason, force, actor, cascade)
            finally:
                calls.append(time.perf_counter() - start)

        store.request_cancel = timed_request_cancel  # type: ignore[method-assign]
        wf = tree(children, fanout)
        start = time.perf_counter()
        jobs = await app.enqueue_workflow(wf)
        enqueue_s = time.perf_counter() - start
        total = len(jobs)
        stats = await app.jobs.stats()
        if stats["queued"] != 1 or stats["blocked"] != total - 1:
            raise RuntimeError(f"graph of {total} enqueued as {stats}")
        root = jobs["root"].id
        start = time.perf_counter()
        result = await app.cancel(root, wait=CASCADE_WAIT)
        cancel_s = time.perf_counter() - start
        stats = await app.jobs.stats()
        if stats["cancelled"] != total or result.status != "completed":
            raise RuntimeError(
                f"after cancelling the root of {total} jobs: {stats}; record {result.status} "
                f"{result.errors[:3]}"
            )
        return CascadeRun(total, cancel_s, sum(calls), enqueue_s, result.status, stats["cancelled"])
    finally:
        with contextlib.suppress(Exception):
            await app.close()


async def release(url: str, dependents: int, timeout: float) -> ReleaseRun:
    """Time the release of ``dependents`` blocked jobs; see the module docstring."""
    RETURNED.clear()
    app = make_app(url)
    try:
        store = await app.store()
        finishes: list[tuple[float, float, tuple[int, ...]]] = []
        finish = store.finish

        async def timed_finish(worker_id: str, outcomes: Sequence[Outcome]) -> Finished:
            start = time.perf_counter()
            accepted = await finish(worker_id, outcomes)
            finishes.append((start, time.perf_counter(), tuple(o.job_id for o in outcomes)))
            return accepted

        store.finish = timed_finish  # type: ignore[method-assign]
        # A, then its dependents, each depending on A alone in one transaction; all
        # before the worker starts (untimed).
        a = await app.enqueue(UPSTREAM)
        await app.enqueue_many([(NODE, {})] * dependents, depends_on=(a.id,))
        stats = await app.jobs.stats()
        if stats["blocked"] != dependents or stats["queued"] != 1:
            raise RuntimeError(f"A and {dependents} dependents enqueued as {stats}")
        worker = app.worker(RELEASE_CONFIG)
        await worker.start()
        try:

            async def run(job_id: int) -> tuple[float, float]:
                final = await app.wait(job_id, timeout)
                if final.state is not JobState.SUCCEEDED:
                    raise RuntimeError(f"job {job_id} ended {final.state}")
                # app.wait can answer before the worker's finish() call has returned.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout
                while not (hit := [f for f in finishes if job_id in f[2]]):
                    if loop.time() > deadline:
                        raise RuntimeError(f"no finish() call seen for job {job_id}")
                    await asyncio.sleep(0.001)
                start, end, ids = hit[0]
                if len(ids) != 1:
                    raise RuntimeError(f"job {job_id} finished in a batch of {len(ids)}")
                return end - start, end - RETURNED[job_id]

            finish_s, end_to_end_s = await run(a.id)
            plain = await app.enqueue(UPSTREAM)
            baseline_s, _ = await run(plain.id)
        finally:
            await asyncio.wait_for(worker.stop(), 60)
        stats = await app.jobs.stats()
        if stats["queued"] != dependents or stats["blocked"] != 0:
            raise RuntimeError(f"after A succeeded: {stats}; expected {dependents} queued")
        return ReleaseRun(dependents, finish_s, end_to_end_s, baseline_s, stats["queued"])
    finally:
        with contextlib.suppress(Exception):
            await app.close()
