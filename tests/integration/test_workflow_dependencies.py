"""Dependencies and workflows on both stores, with real workers: ``depends_on`` blocks a
job until everything it depends on succeeded; a failure or a cancellation cancels
everything downstream, transitively and in one transaction, and nothing cancelled ever
comes back; ``enqueue_workflow`` writes a whole graph or nothing (seed 004, section 6)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import tether
from tests.helpers import eventually, fast_config
from tests.integration.conftest import StartWorker
from tests.integration.workflow_support import cancelled_in_one_transaction, in_state
from tether import App, IllegalTransitionError, InvalidJobError, JobContext, JobState, Worker
from tether.workflow import Workflow

UPSTREAM = "an upstream job was cancelled or failed"


def _noop(app: App) -> tether.Task:
    @app.task(name="noop")
    async def noop(ctx: JobContext, **args: object) -> None:
        return None

    return noop


async def test_job_with_dependencies_starts_blocked_and_runs_after_all_succeeded(
    app: App, workers: StartWorker
) -> None:
    gates = {"a": asyncio.Event(), "b": asyncio.Event()}
    order: list[str] = []

    @app.task
    async def step(ctx: JobContext, name: str) -> str:
        if name in gates:
            await gates[name].wait()
        order.append(name)
        return name

    await workers()
    a = await step.enqueue(name="a")
    b = await step.enqueue(name="b")
    c = await app.enqueue(step, {"name": "c"}, depends_on=(a.id, b.id))
    d = await step.options(depends_on=(c.id,)).enqueue(name="d")
    assert (c.state, d.state) == (JobState.BLOCKED, JobState.BLOCKED)
    assert c.display_state == "blocked" and not c.waiting_children
    assert await app.jobs.dependencies(c.id) == (sorted([a.id, b.id]), [d.id])
    assert await app.jobs.dependencies(a.id) == ([], [c.id])

    gates["a"].set()
    assert (await app.wait(a.id, timeout=10)).state is JobState.SUCCEEDED
    assert (await app.get(c.id)).state is JobState.BLOCKED, "one of two is not enough"
    gates["b"].set()
    done = await app.wait(d.id, timeout=10)
    assert (done.state, done.result) == (JobState.SUCCEEDED, "d")
    assert order == ["a", "b", "c", "d"]
    ran_c = await app.get(c.id)
    finished_b = await app.get(b.id)
    assert ran_c.started_at is not None and finished_b.finished_at is not None
    assert ran_c.started_at >= finished_b.finished_at
    unblocked = [e for e in await app.jobs.events(c.id) if e.from_state is JobState.BLOCKED]
    assert [(e.to_state, e.reason) for e in unblocked] == [
        (JobState.QUEUED, "dependencies succeeded")
    ]
    # A dependency that has already succeeded blocks nothing.
    late = await app.enqueue(step, {"name": "e"}, depends_on=(a.id, b.id))
    assert late.state is JobState.QUEUED
    assert (await app.wait(late.id, timeout=10)).state is JobState.SUCCEEDED


async def test_failed_dependency_cancels_dependents_transitively_in_one_transaction(
    app: App, workers: StartWorker
) -> None:
    go = asyncio.Event()
    ran: list[str] = []

    @app.task(max_attempts=1)
    async def step(ctx: JobContext, name: str) -> str:
        ran.append(name)
        if name == "a":
            await go.wait()
            raise tether.Fail("a broke")
        return name

    a = await step.enqueue(name="a")
    b = await step.options(depends_on=(a.id,)).enqueue(name="b")
    c = await step.options(depends_on=(b.id,)).enqueue(name="c")
    d = await step.options(depends_on=(a.id, c.id)).enqueue(name="d")
    await workers()
    await eventually(lambda: in_state(app, a.id, JobState.RUNNING))
    async with cancelled_in_one_transaction(app, a.id, [b.id, c.id, d.id]):
        go.set()
        assert (await app.wait(a.id, timeout=10)).state is JobState.FAILED
    assert ran == ["a"]
    for job_id in (b.id, c.id, d.id):
        job = await app.get(job_id)
        assert (job.state, job.cancel_reason, job.attempt) == (JobState.CANCELLED, UPSTREAM, 0)
        last = (await app.jobs.events(job_id))[-1]
        assert (last.from_state, last.to_state, last.actor, last.reason) == (
            JobState.BLOCKED,
            JobState.CANCELLED,
            "tether",
            UPSTREAM,
        )


async def test_cancelling_the_root_of_a_large_graph_cancels_all_downstream_in_one_transaction(
    app: App,
) -> None:
    noop = _noop(app)
    wf = Workflow()
    wf.add("root", noop)
    previous = "root"
    for i in range(80):  # a chain 80 deep
        wf.add(f"chain{i}", noop, depends_on=[previous])
        previous = f"chain{i}"
    fans = [wf.add(f"fan{i}", noop, depends_on=["root"]) for i in range(20)]
    wf.add("join", noop, depends_on=[previous, *fans])
    jobs = await app.enqueue_workflow(wf)
    assert len(jobs) == 102
    root = jobs.pop("root")
    assert root.state is JobState.QUEUED
    assert {j.state for j in jobs.values()} == {JobState.BLOCKED}
    ids = sorted(j.id for j in jobs.values())
    assert [j.id for j in await app.jobs.downstream(root.id)] == ids

    async with cancelled_in_one_transaction(app, root.id, ids):
        result = await app.cancel(root.id, reason="abandon the run")

    assert (result.outcome, result.status, result.success) == ("cancelled", "completed", True)
    assert sorted(result.tasks_cancelled) == sorted([root.id, *ids])
    assert result.dependents_blocked == []
    record = await app.cancellations.get(root.id)
    assert record is not None and record.cascade
    assert record.result is not None and sorted(record.result.tasks_cancelled or []) == sorted(
        [root.id, *ids]
    )
    everything = {j.id: j for j in await app.jobs.list(limit=1000)}
    assert len(everything) == 102
    assert everything[root.id].cancel_reason == "abandon the run"
    for job_id in ids:
        job = everything[job_id]
        assert (job.state, job.cancel_reason) == (JobState.CANCELLED, UPSTREAM)
        assert job.finished_at is not None


async def test_retrying_a_failed_upstream_job_does_not_resurrect_cancelled_dependents(
    app: App, workers: StartWorker
) -> None:
    calls: list[int] = []
    dependents_ran: list[int] = []

    @app.task(max_attempts=1)
    async def flaky(ctx: JobContext) -> str:
        calls.append(ctx.id)
        if len(calls) == 1:
            raise tether.Fail("broken the first time")
        return "fixed"

    @app.task
    async def dependent(ctx: JobContext) -> None:
        dependents_ran.append(ctx.id)

    up = await flaky.enqueue()
    down = await dependent.options(depends_on=(up.id,)).enqueue()
    further = await dependent.options(depends_on=(down.id,)).enqueue()
    await workers()
    assert (await app.wait(up.id, timeout=10)).state is JobState.FAILED
    before = {i: await app.get(i) for i in (down.id, further.id)}
    assert {j.state for j in before.values()} == {JobState.CANCELLED}

    assert (await app.jobs.retry(up.id)).state is JobState.QUEUED
    done = await app.wait(up.id, timeout=10)
    assert (done.state, done.result) == (JobState.SUCCEEDED, "fixed")
    # Dependents are queued in the transaction of the success: had they come back, it
    # would show now.
    for job_id, job in before.items():
        assert await app.get(job_id) == job, "a cancelled dependent stays cancelled"
    for job_id in before:
        with pytest.raises(IllegalTransitionError):
            await app.jobs.retry(job_id)
    # A new dependent of the now-succeeded job runs as usual.
    fresh = await dependent.options(depends_on=(up.id,)).enqueue()
    assert (await app.wait(fresh.id, timeout=10)).state is JobState.SUCCEEDED
    assert dependents_ran == [fresh.id]


async def test_cancel_without_cascade_leaves_dependents_blocked_and_lists_them(
    app: App, workers: StartWorker
) -> None:
    noop = _noop(app)
    root = await noop.enqueue()
    mid = await noop.options(depends_on=(root.id,)).enqueue()
    leaf = await noop.options(depends_on=(mid.id,)).enqueue()
    side = await noop.options(depends_on=(root.id,)).enqueue()

    result = await app.cancel(root.id, reason="just this one", cascade=False)

    assert (result.outcome, result.status) == ("cancelled", "completed")
    assert result.tasks_cancelled == [root.id]
    assert sorted(result.dependents_blocked) == sorted([mid.id, leaf.id, side.id])
    for job in (mid, leaf, side):
        after = await app.get(job.id)
        assert (after.state, after.cancel_requested_at) == (JobState.BLOCKED, None)
    record = await app.cancellations.get(root.id)
    assert record is not None and not record.cascade
    assert record.result is not None and sorted(record.result.dependents_blocked or []) == sorted(
        [mid.id, leaf.id, side.id]
    )
    worker = await workers(services=False)
    assert await worker.claimer.run_once() == 0, "blocked dependents never run"

    # Cancelling one of them later, with cascade, takes only its own downstream.
    second = await app.cancel(mid.id, reason="clean up")
    assert sorted(second.tasks_cancelled) == sorted([mid.id, leaf.id])
    assert second.dependents_blocked == []
    assert (await app.get(leaf.id)).cancel_reason == UPSTREAM
    assert (await app.get(side.id)).state is JobState.BLOCKED


# -- enqueue_workflow ---------------------------------------------------------------------


async def test_workflow_diamond_runs_in_dependency_order(app: App, workers: StartWorker) -> None:
    log: list[tuple[str, str]] = []
    ext_gate = asyncio.Event()

    @app.task
    async def step(ctx: JobContext, name: str) -> str:
        if name == "ext":
            await ext_gate.wait()
        log.append(("start", name))
        await asyncio.sleep(0.02)
        log.append(("end", name))
        return name

    ext = await step.enqueue(name="ext")  # an existing job the workflow depends on
    wf = Workflow()
    # Added out of order on purpose.
    wf.add("d", step, {"name": "d"}, depends_on=["b", "c"])
    wf.add("b", step, {"name": "b"}, depends_on=["a"])
    wf.add("c", step, {"name": "c"}, depends_on=["a"])
    wf.add("a", step, {"name": "a"}, depends_on=[ext.id])
    jobs = await app.enqueue_workflow(wf)
    assert set(jobs) == {"a", "b", "c", "d"}
    assert {j.state for j in jobs.values()} == {JobState.BLOCKED}
    a, b, c, d = (jobs[n].id for n in "abcd")
    assert await app.jobs.dependencies(a) == ([ext.id], sorted([b, c]))
    assert await app.jobs.dependencies(d) == (sorted([b, c]), [])
    assert sorted(j.id for j in await app.jobs.downstream(ext.id)) == sorted([a, b, c, d])

    await workers()
    ext_gate.set()
    done = await app.wait(d, timeout=10)
    assert (done.state, done.result) == (JobState.SUCCEEDED, "d")
    for job_id in (a, b, c):
        assert (await app.get(job_id)).state is JobState.SUCCEEDED
    at = {entry: i for i, entry in enumerate(log)}
    assert at[("end", "ext")] < at[("start", "a")]
    assert at[("end", "a")] < min(at[("start", "b")], at[("start", "c")])
    assert max(at[("end", "b")], at[("end", "c")]) < at[("start", "d")]


async def test_workflow_with_a_cycle_is_rejected_naming_it_and_writes_nothing(app: App) -> None:
    noop = _noop(app)
    wf = Workflow()
    wf.add("fine", noop)
    wf.add("a", noop, depends_on=["b"])
    wf.add("b", noop, depends_on=["a"])
    with pytest.raises(InvalidJobError, match=r"dependency cycle: (a -> b -> a|b -> a -> b)"):
        await app.enqueue_workflow(wf)

    longer = Workflow()
    longer.add("x", noop, depends_on=["z"])
    longer.add("y", noop, depends_on=["x"])
    longer.add("z", noop, depends_on=["y"])
    with pytest.raises(InvalidJobError, match=r"dependency cycle: x -> z -> y -> x"):
        await app.enqueue_workflow(longer)

    itself = Workflow()
    itself.add("me", noop, depends_on=["me"])
    with pytest.raises(InvalidJobError, match="'me' depends on itself"):
        await app.enqueue_workflow(itself)

    unknown = Workflow()
    unknown.add("lonely", noop, depends_on=["nobody"])
    with pytest.raises(InvalidJobError, match="'lonely' depends on unknown job 'nobody'"):
        await app.enqueue_workflow(unknown)

    with pytest.raises(InvalidJobError, match="already has a job named 'fine'"):
        wf.add("fine", noop)
    assert await app.jobs.list() == []


async def test_workflow_with_an_unknown_dependency_id_is_rejected_and_writes_nothing(
    app: App,
) -> None:
    noop = _noop(app)
    wf = Workflow()
    wf.add("first", noop)
    wf.add("second", noop, depends_on=["first", 999_999])  # inserted after "first"
    with pytest.raises(InvalidJobError, match=r"unknown dependency id\(s\): 999999"):
        await app.enqueue_workflow(wf)
    assert await app.jobs.list() == [], "the whole workflow is rolled back"
    with pytest.raises(InvalidJobError, match="999999"):
        await app.enqueue(noop, {}, depends_on=(999_999,))
    with pytest.raises(InvalidJobError, match="999999"):
        await noop.options(depends_on=(999_999,)).enqueue()
    assert await app.jobs.list() == []
    # The queue keeps going.
    ok = Workflow()
    ok.add("first", noop)
    ok.add("second", noop, depends_on=["first"])
    assert len(await app.enqueue_workflow(ok)) == 2


@pytest.mark.parametrize("dead_state", ["cancelled", "failed"])
async def test_workflow_depending_on_a_dead_job_is_rejected_and_writes_nothing(
    app: App, workers: StartWorker, dead_state: str
) -> None:
    @app.task(max_attempts=1)
    async def doomed(ctx: JobContext) -> None:
        raise tether.Fail("no")

    noop = _noop(app)
    gone = await doomed.enqueue()
    if dead_state == "cancelled":
        await app.cancel(gone.id)
    else:
        await workers()
        await app.wait(gone.id, timeout=10)
    assert (await app.get(gone.id)).state.value == dead_state

    wf = Workflow()
    wf.add("first", noop)
    wf.add("second", noop, depends_on=["first", gone.id])
    message = f"dependency {gone.id} is {dead_state}; a job depending on it could never run"
    with pytest.raises(InvalidJobError, match=message):
        await app.enqueue_workflow(wf)
    with pytest.raises(InvalidJobError, match=message):
        await app.enqueue(noop, {}, depends_on=(gone.id,))
    assert [j.id for j in await app.jobs.list()] == [gone.id], "nothing was written"


@pytest.mark.postgres
async def test_a_transactional_enqueue_held_open_does_not_cost_its_upstream_its_lease(
    pg_url: str,
) -> None:
    # Issue 22, defect 1: the caller's open transaction held the running upstream's row
    # (FOR SHARE, then has_dependents), so its worker could not beat, fenced itself and
    # ran the job again. The caller here holds its transaction for three leases.
    app = App(pg_url, config=tether.AppConfig(wait_poll_interval=0.05))
    started, release = asyncio.Event(), asyncio.Event()

    @app.task(name="upstream")
    async def upstream(ctx: JobContext) -> str:
        started.set()
        await release.wait()
        return "done"

    noop = _noop(app)
    worker = Worker(app, fast_config())
    await worker.start()
    caller = await psycopg.AsyncConnection.connect(pg_url)
    try:
        up = await upstream.enqueue()
        await asyncio.wait_for(started.wait(), 10)
        dep = await noop.options(connection=caller, depends_on=(up.id,)).enqueue()
        await asyncio.sleep(3 * worker.config.lease_duration)  # the caller's transaction
        release.set()
        ended = await app.wait(up.id, timeout=10)  # while the caller still holds it open
        assert (ended.state, ended.attempt) == (JobState.SUCCEEDED, 1)
        await caller.commit()
        assert (await app.wait(dep.id, timeout=10)).state is JobState.SUCCEEDED
        reasons = [e.reason or "" for e in await app.jobs.events(up.id)]
        assert not any("lease" in r for r in reasons), reasons
    finally:
        release.set()
        await caller.close()
        await worker.stop()
        await app.close()
