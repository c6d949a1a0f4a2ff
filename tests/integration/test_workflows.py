"""Parents and children on both stores, with real workers: spawning, two-phase parents
(ingest, then aggregate), smart phase recovery, spawn fencing, cascade delete and
orphan cleanup (seed 002's parent-child lifecycle, in tether form)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import tether
from tests.helpers import eventually
from tests.integration.conftest import StartWorker
from tests.integration.workflow_support import dialect, execute, idle, in_state
from tether import App, Job, JobContext, JobState, LeaseLostError
from tether.errors import WaitForChildren

TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


async def _children_in(app: App, parent_id: int, count: int, *states: JobState) -> bool:
    kids = await app.jobs.children(parent_id)
    return len(kids) == count and all(k.state in states for k in kids)


async def _not_running(app: App, job_id: int) -> tether.Job | None:
    job = await app.get(job_id)
    return None if job.state is JobState.RUNNING else job


def _path(events: list[tether.JobEvent]) -> list[tuple[JobState | None, JobState]]:
    return [(e.from_state, e.to_state) for e in events]


def test_workflow_names_are_part_of_the_public_api() -> None:
    from tether.errors import WaitForChildren
    from tether.workflow import Workflow

    assert getattr(tether, "WaitForChildren", None) is WaitForChildren
    assert getattr(tether, "Workflow", None) is Workflow
    assert {"WaitForChildren", "Workflow"} <= set(tether.__all__)


# -- the hierarchy ------------------------------------------------------------------------


async def test_spawned_children_carry_parent_id_and_owner_and_are_listed(
    app: App, workers: StartWorker
) -> None:
    spawned = asyncio.Event()
    release = asyncio.Event()
    returned: list[tether.Job] = []

    @app.task(queue="parked")
    async def leaf(ctx: JobContext, n: int) -> int:
        return n

    @app.task
    async def parent(ctx: JobContext, n: int) -> None:
        returned.extend([await ctx.spawn(leaf, n=i) for i in range(n)])
        returned.append(await ctx.spawn(leaf.name, n=n))  # a task name works too
        spawned.set()
        await release.wait()

    await workers()
    job = await app.enqueue(parent, {"n": 2}, owner="alice")
    await asyncio.wait_for(spawned.wait(), 10)
    kids = await app.jobs.children(job.id)
    assert [k.id for k in kids] == [j.id for j in returned]
    assert [k.args for k in kids] == [{"n": 0}, {"n": 1}, {"n": 2}]
    for kid in kids:
        assert (kid.parent_id, kid.owner, kid.task) == (job.id, "alice", leaf.name)
        assert kid.state is JobState.QUEUED
        first = (await app.jobs.events(kid.id))[0]
        assert (first.from_state, first.to_state, first.actor) == (None, JobState.QUEUED, "spawn")
    assert {j.id for j in await app.jobs.list(parent_id=job.id)} == {k.id for k in kids}
    assert await app.jobs.children(kids[0].id) == []
    assert (await app.get(job.id)).parent_id is None
    release.set()
    assert (await app.wait(job.id, timeout=10)).state is JobState.SUCCEEDED


async def test_thread_handler_spawns_and_reads_children(app: App, workers: StartWorker) -> None:
    @app.task(queue="parked")
    async def leaf(ctx: JobContext) -> None:
        return None

    @app.task
    def parent(ctx: tether.SyncJobContext) -> list[int]:
        mine = [ctx.spawn(leaf).id, ctx.spawn(leaf).id]
        assert [k.id for k in ctx.children()] == mine
        return mine

    await workers()
    job = await app.enqueue(parent, {}, owner="bob")
    done = await app.wait(job.id, timeout=10)
    assert done.state is JobState.SUCCEEDED, done.error
    kids = await app.jobs.children(job.id)
    assert [k.id for k in kids] == done.result
    assert {(k.parent_id, k.owner) for k in kids} == {(job.id, "bob")}


# -- two-phase parents --------------------------------------------------------------------


@pytest.mark.parametrize("how", ["raise", "return"])
async def test_two_phase_parent_waits_without_holding_a_worker_then_aggregates(
    app: App, workers: StartWorker, how: str
) -> None:
    gate = asyncio.Event()
    children_running: set[int] = set()
    phases: list[str | None] = []

    @app.task
    async def square(ctx: JobContext, x: int) -> int:
        children_running.add(ctx.id)
        await gate.wait()
        if x < 0:
            raise tether.Fail("negative input")
        return x * x

    @app.task
    async def batch(ctx: JobContext, items: list[int]) -> Any:
        phases.append(ctx.phase)
        if ctx.phase is None:
            for x in items:
                await ctx.spawn(square, x=x)
            wait = WaitForChildren(phase="aggregate")
            if how == "raise":
                raise wait
            return wait
        kids = await ctx.children()
        return {
            "states": [k.state.value for k in kids],
            "total": sum(k.result for k in kids if k.state is JobState.SUCCEEDED),
        }

    # Three slots: all three children can only run at once if the parent holds none.
    worker = await workers(concurrency=3)
    job = await batch.enqueue(items=[1, 2, -3])

    async def three_children_running() -> bool:
        return len(children_running) == 3

    await eventually(three_children_running)

    # The parent's slot frees when its handler ends; its outcome may still be on its way.
    async def parent_waiting() -> Job | None:
        parent = await app.get(job.id)
        return parent if parent.state is JobState.BLOCKED else None

    waiting = await eventually(parent_waiting)
    assert waiting.display_state == "waiting for children"
    assert (waiting.waiting_children, waiting.phase) == (True, "aggregate")
    assert waiting.lease_expires_at is None
    assert waiting.attempt == 0, "ending a phase does not spend an attempt"
    assert job.id not in worker.running
    assert set(worker.running) == children_running

    gate.set()
    done = await app.wait(job.id, timeout=10)
    assert done.state is JobState.SUCCEEDED, done.error
    assert done.result == {"states": ["succeeded", "succeeded", "failed"], "total": 5}
    assert phases == [None, "aggregate"]
    assert (done.phase, done.waiting_children, done.attempt) == ("aggregate", False, 1)
    events = await app.jobs.events(job.id)
    assert _path(events) == [
        (None, JobState.QUEUED),
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.RUNNING, JobState.BLOCKED),
        (JobState.BLOCKED, JobState.QUEUED),
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.RUNNING, JobState.SUCCEEDED),
    ]
    assert events[2].reason == "waiting for children; next phase aggregate"
    assert events[3].reason == "children finished; phase aggregate"


async def test_parent_whose_children_already_ended_is_requeued_at_once(
    app: App, workers: StartWorker
) -> None:
    @app.task
    async def plus_one(ctx: JobContext, x: int) -> int:
        return x + 1

    @app.task
    async def batch(ctx: JobContext) -> list[int]:
        if ctx.phase is None:
            for x in range(3):
                await ctx.spawn(plus_one, x=x)

            async def all_ended() -> bool:
                kids = await ctx.children()
                return len(kids) == 3 and all(k.state in TERMINAL for k in kids)

            await eventually(all_ended)
            # No child is left to end later: only this transition can queue us again.
            raise WaitForChildren(phase="aggregate")
        return sorted(k.result for k in await ctx.children())

    await workers()
    job = await batch.enqueue()
    done = await app.wait(job.id, timeout=10)
    assert (done.state, done.result) == (JobState.SUCCEEDED, [1, 2, 3])
    events = await app.jobs.events(job.id)
    blocked = [i for i, e in enumerate(events) if e.to_state is JobState.BLOCKED]
    assert len(blocked) == 1
    requeue = events[blocked[0] + 1]
    assert (requeue.from_state, requeue.to_state) == (JobState.BLOCKED, JobState.QUEUED)
    assert requeue.reason == "children finished; phase aggregate"
    if await dialect(app) == "postgresql":
        assert requeue.at == events[blocked[0]].at, "re-queued in the same transaction"


async def test_parent_can_run_several_phases_and_sees_all_its_children(
    app: App, workers: StartWorker
) -> None:
    phases: list[str | None] = []

    @app.task
    async def leaf(ctx: JobContext, x: int) -> int:
        return x

    @app.task
    async def parent(ctx: JobContext) -> list[int]:
        phases.append(ctx.phase)
        if ctx.phase is None:
            await ctx.spawn(leaf, x=1)
            raise WaitForChildren(phase="aggregate")
        if ctx.phase == "aggregate":
            await ctx.spawn(leaf, x=2)
            await ctx.spawn(leaf, x=3)
            raise WaitForChildren(phase="finalize")
        return [k.result for k in await ctx.children()]

    await workers()
    job = await parent.enqueue()
    done = await app.wait(job.id, timeout=10)
    assert (done.state, done.result, done.phase) == (JobState.SUCCEEDED, [1, 2, 3], "finalize")
    assert phases == [None, "aggregate", "finalize"]
    assert done.attempt == 1


async def test_cancelling_a_waiting_parent_cancels_its_children(
    app: App, workers: StartWorker
) -> None:
    held_started = asyncio.Event()

    @app.task(queue="parked")
    async def queued_kid(ctx: JobContext) -> None:
        return None

    @app.task
    async def running_kid(ctx: JobContext) -> None:
        held_started.set()
        await asyncio.sleep(30)

    @app.task
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn(queued_kid)
        await ctx.spawn(running_kid)
        raise WaitForChildren(phase="aggregate")

    await workers()
    job = await parent.enqueue()
    await asyncio.wait_for(held_started.wait(), 10)
    waiting = await eventually(lambda: in_state(app, job.id, JobState.BLOCKED))
    assert waiting.display_state == "waiting for children"
    kids = [k.id for k in await app.jobs.children(job.id)]

    result = await app.cancel(job.id, reason="give up", wait=10)

    assert (result.outcome, result.status) == ("cancelled", "completed")
    assert sorted(result.tasks_cancelled) == sorted([job.id, *kids])
    for kid_id in kids:
        kid = await app.get(kid_id)
        assert kid.state is JobState.CANCELLED
    assert (await app.get(job.id)).cancel_reason == "give up"


# -- smart phase recovery -----------------------------------------------------------------


async def test_rescued_parent_in_aggregate_phase_with_children_stays_in_it(
    app: App, workers: StartWorker
) -> None:
    crash_now = asyncio.Event()
    ingests: list[int] = []

    @app.task
    async def leaf(ctx: JobContext, x: int) -> int:
        return x

    @app.task(max_attempts=3)
    async def parent(ctx: JobContext) -> int:
        if ctx.phase is None:
            ingests.append(ctx.attempt)
            for x in (1, 2):
                await ctx.spawn(leaf, x=x)
            raise WaitForChildren(phase="aggregate")
        if not crash_now.is_set():  # the first aggregate run hangs, then "crashes"
            crash_now.set()
            await asyncio.sleep(30)
        return sum(k.result for k in await ctx.children())

    crashing = await workers(services=False)
    job = await parent.enqueue()
    assert await crashing.claimer.run_once() == 1  # the parent: ingest
    await eventually(lambda: in_state(app, job.id, JobState.BLOCKED))
    assert await crashing.claimer.run_once() == 2  # its children
    await eventually(lambda: in_state(app, job.id, JobState.QUEUED))
    assert await crashing.claimer.run_once() == 1  # the parent: aggregate
    await asyncio.wait_for(crash_now.wait(), 10)

    store = await app.store()
    await store.set_worker_state(crashing.id, "dead")
    rescued = await store.rescue()
    assert [(j.id, j.state, j.phase) for j in rescued] == [(job.id, JobState.RETRYING, "aggregate")]
    decision = (await app.jobs.events(job.id))[-1]
    assert (decision.from_state, decision.to_state, decision.actor) == (
        JobState.RUNNING,
        JobState.RETRYING,
        "rescuer",
    )
    assert decision.reason == "worker dead; staying in phase aggregate (2 children found)"
    await crashing.heartbeater.run_once()  # the old worker learns its lease is gone
    await eventually(lambda: idle(crashing))

    await workers()
    done = await app.wait(job.id, timeout=10)
    assert (done.state, done.result, done.phase) == (JobState.SUCCEEDED, 3, "aggregate")
    assert ingests == [1], "the ingest phase did not run again"
    assert len(await app.jobs.children(job.id)) == 2


async def test_rescued_parent_in_aggregate_phase_without_children_restarts_ingest(
    app: App, workers: StartWorker
) -> None:
    holding = asyncio.Event()
    phases: list[str | None] = []

    @app.task
    async def leaf(ctx: JobContext, x: int) -> int:
        return x

    @app.task(max_attempts=3)
    async def parent(ctx: JobContext) -> int:
        phases.append(ctx.phase)
        if ctx.phase is None:
            if len(phases) == 1:  # the first attempt crashes before it spawns anything
                holding.set()
                await asyncio.sleep(30)
            for x in (1, 2, 3):
                await ctx.spawn(leaf, x=x)
            raise WaitForChildren(phase="aggregate")
        return sum(k.result for k in await ctx.children())

    @app.task(max_attempts=3)
    async def plain(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            await asyncio.sleep(30)
        return "ok"

    crashing = await workers(services=False)
    job = await parent.enqueue()
    other = await plain.enqueue()
    assert await crashing.claimer.run_once() == 2
    await asyncio.wait_for(holding.wait(), 10)
    # The crash came between the phase change and the spawns: the phase says
    # "aggregate" but no child exists. Both leases have expired.
    await execute(
        app,
        sqlite="UPDATE tether_jobs SET phase = CASE WHEN id = ? THEN 'aggregate' END, "
        "lease_expires_at = lease_expires_at - 3600 WHERE id IN (?, ?)",
        postgres="UPDATE tether_jobs SET phase = CASE WHEN id = %s THEN 'aggregate' END, "
        "lease_expires_at = lease_expires_at - interval '1 hour' WHERE id IN (%s, %s)",
        params=(job.id, job.id, other.id),
    )
    rescued = {j.id: j for j in await (await app.store()).rescue()}
    assert set(rescued) == {job.id, other.id}
    assert (rescued[job.id].state, rescued[job.id].phase) == (JobState.RETRYING, None)
    decision = (await app.jobs.events(job.id))[-1]
    assert decision.actor == "rescuer"
    assert decision.reason == "lease expired; reset to the ingest phase (no children found)"
    # A job crashing in its first phase needs no special handling.
    assert (rescued[other.id].state, rescued[other.id].phase) == (JobState.RETRYING, None)
    assert (await app.jobs.events(other.id))[-1].reason == "lease expired"

    await crashing.heartbeater.run_once()
    await eventually(lambda: idle(crashing))
    await workers()
    done = await app.wait(job.id, timeout=10)
    assert (done.state, done.result) == (JobState.SUCCEEDED, 6)
    assert phases == [None, None, "aggregate"], "the job ran again from the ingest phase"
    assert len(await app.jobs.children(job.id)) == 3
    assert (await app.wait(other.id, timeout=10)).state is JobState.SUCCEEDED


# -- spawn is fenced by the parent's lease -------------------------------------------------


async def test_spawn_after_a_cancel_request_raises_lease_lost_and_creates_nothing(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()
    seen: list[str] = []

    @app.task(queue="parked")
    async def leaf(ctx: JobContext) -> None:
        return None

    @app.task
    async def parent(ctx: JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()  # the request has reached the handler
        try:
            await ctx.spawn(leaf)
        except LeaseLostError:
            seen.append("lease lost")
            raise
        seen.append("spawned")

    await workers(cancel_grace=2.0)
    job = await parent.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    await app.cancel(job.id, reason="stop", wait=10)
    final = await app.wait(job.id, timeout=10)
    assert seen == ["lease lost"]
    assert final.state is JobState.CANCELLED
    assert await app.jobs.children(job.id) == []
    assert await app.jobs.list(task=leaf.name) == []


async def test_parent_refused_a_spawn_after_cancel_is_cancelled_promptly_not_at_lease_expiry(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()

    @app.task(queue="parked")
    async def leaf(ctx: JobContext) -> None:
        return None

    @app.task
    async def parent(ctx: JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        await ctx.spawn(leaf)

    # A lease far longer than the cancel takes: it must not be what ends the job.
    await workers(lease_duration=20.0, cancel_grace=0.3)
    job = await parent.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    result = await app.cancel(job.id, reason="stop", wait=3)
    assert (result.outcome, result.status, result.errors) == ("cancelled", "completed", [])
    assert result.job.state is JobState.CANCELLED


@pytest.mark.parametrize("moved_on_by", ["rescue", "delete"])
async def test_spawn_after_the_lease_moved_on_raises_lease_lost_and_creates_nothing(
    app: App, workers: StartWorker, moved_on_by: str
) -> None:
    started = asyncio.Event()
    go = asyncio.Event()
    seen: list[str] = []

    @app.task(queue="parked")
    async def leaf(ctx: JobContext) -> None:
        return None

    @app.task(max_attempts=3)
    async def parent(ctx: JobContext) -> None:
        started.set()
        await go.wait()
        try:
            await ctx.spawn(leaf)
        except LeaseLostError:
            seen.append("lease lost")
            raise
        seen.append("spawned")

    worker = await workers(services=False)  # no heartbeat: the handler is not told
    job = await parent.enqueue()
    assert await worker.claimer.run_once() == 1
    await asyncio.wait_for(started.wait(), 10)
    claimed = await app.get(job.id)
    store = await app.store()
    if moved_on_by == "rescue":
        await store.set_worker_state(worker.id, "dead")
        (rescued,) = await store.rescue()
        assert rescued.lease_token == claimed.lease_token + 1
    else:
        assert await app.jobs.delete(job.id) == []
    go.set()

    async def spawn_tried() -> bool:
        return bool(seen)

    await eventually(spawn_tried)
    await eventually(lambda: idle(worker))
    assert seen == ["lease lost"]
    assert await app.jobs.children(job.id) == []
    assert await app.jobs.list(task=leaf.name) == []
    if moved_on_by == "rescue":
        after = await app.get(job.id)
        assert (after.state, after.lease_token) == (JobState.RETRYING, rescued.lease_token)
    else:
        with pytest.raises(tether.JobNotFoundError):
            await app.get(job.id)


# -- cascade delete -----------------------------------------------------------------------


async def test_deleting_a_parent_cancels_active_children_and_keeps_finished_ones(
    app: App, workers: StartWorker
) -> None:
    held_started = asyncio.Event()
    release = asyncio.Event()
    parked_ran: list[int] = []

    @app.task
    async def ok(ctx: JobContext) -> str:
        return "ok"

    @app.task
    async def bad(ctx: JobContext) -> None:
        raise tether.Fail("bad")

    @app.task(queue="parked")
    async def later(ctx: JobContext) -> None:
        parked_ran.append(ctx.id)

    @app.task
    async def held(ctx: JobContext) -> str:
        held_started.set()
        await release.wait()
        return "late"

    @app.task
    async def parent(ctx: JobContext) -> None:
        for task in (ok, bad, later, later, later, held):
            await ctx.spawn(task)
        raise WaitForChildren(phase="aggregate")

    worker = await workers()
    job = await parent.enqueue()
    await eventually(lambda: in_state(app, job.id, JobState.BLOCKED))
    ok_id, bad_id, gone_id, paused_id, queued_id, held_id = [
        k.id for k in await app.jobs.children(job.id)
    ]
    await asyncio.wait_for(held_started.wait(), 10)
    await app.wait(ok_id, timeout=10)
    await app.wait(bad_id, timeout=10)
    assert (await app.cancel(gone_id, reason="not needed")).outcome == "cancelled"
    assert (await app.jobs.pause(paused_id)).state is JobState.PAUSED
    running = await app.get(held_id)
    assert running.state is JobState.RUNNING
    ended = {i: await app.get(i) for i in (ok_id, bad_id, gone_id)}
    assert [j.state for j in ended.values()] == [
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
    ]

    cancelled = await app.jobs.delete(job.id)

    assert sorted(j.id for j in cancelled) == sorted([paused_id, queued_id, held_id])
    for kid in cancelled:
        assert (kid.state, kid.cancel_reason) == (JobState.CANCELLED, "parent job deleted")
    for kid_id in (paused_id, queued_id, held_id):
        kid = await app.get(kid_id)
        assert (kid.state, kid.cancel_reason) == (JobState.CANCELLED, "parent job deleted")
        assert (await app.jobs.events(kid_id))[-1].reason == "parent job deleted"
    revoked = await app.get(held_id)
    assert revoked.lease_token == running.lease_token + 1 and revoked.lease_expires_at is None
    for kid_id, before in ended.items():
        assert await app.get(kid_id) == before, "finished children are kept unchanged"
    with pytest.raises(tether.JobNotFoundError):
        await app.get(job.id)
    with pytest.raises(tether.JobNotFoundError):
        await app.jobs.delete(job.id)
    # The children stay, for the audit trail, still pointing at their parent.
    assert len(await app.jobs.children(job.id)) == 6

    release.set()
    await eventually(lambda: idle(worker))
    late = await app.get(held_id)
    assert (late.state, late.result) == (JobState.CANCELLED, None), "its late result is ignored"
    parked = await workers(services=False, queues=("parked",))
    assert await parked.claimer.run_once() == 0
    assert parked_ran == []


async def test_deleting_the_last_active_child_requeues_its_waiting_parent(
    app: App, workers: StartWorker
) -> None:
    @app.task(queue="parked")
    async def stuck(ctx: JobContext) -> None:
        return None

    @app.task
    async def parent(ctx: JobContext) -> list[str]:
        if ctx.phase is None:
            await ctx.spawn(stuck)
            raise WaitForChildren(phase="aggregate")
        return [k.state.value for k in await ctx.children()]

    await workers()
    job = await parent.enqueue()
    await eventually(lambda: in_state(app, job.id, JobState.BLOCKED))
    (kid,) = await app.jobs.children(job.id)
    assert await app.jobs.delete(kid.id) == []
    done = await app.wait(job.id, timeout=10)
    assert (done.state, done.result) == (JobState.SUCCEEDED, [])


# -- orphan cleanup -----------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["succeeds", "fails"])
async def test_parent_that_ends_cancels_its_active_children_and_ignores_late_results(
    app: App, workers: StartWorker, ending: str
) -> None:
    spawned = asyncio.Event()
    finish_parent = asyncio.Event()
    slow_started = asyncio.Event()
    release_slow = asyncio.Event()
    slow_returned: list[int] = []
    parked_ran: list[int] = []
    ids: dict[str, int] = {}

    @app.task
    async def quick(ctx: JobContext) -> str:
        return "quick"

    @app.task(queue="parked")
    async def parked(ctx: JobContext) -> None:
        parked_ran.append(ctx.id)

    @app.task(queue="kids")
    async def slow(ctx: JobContext) -> str:
        slow_started.set()
        await release_slow.wait()
        slow_returned.append(ctx.id)
        return "late result"

    @app.task(max_attempts=1)
    async def parent(ctx: JobContext) -> str:
        ids["done"] = (await ctx.spawn(quick)).id
        ids["queued"] = (await ctx.spawn(parked)).id
        ids["paused"] = (await ctx.spawn(parked)).id
        ids["running"] = (await ctx.spawn(slow)).id
        spawned.set()
        await finish_parent.wait()
        if ending == "fails":
            raise tether.Fail("parent gave up")
        return "parent done"

    await workers()  # the default queue: the parent and the quick child
    kids = await workers(services=False, queues=("kids",))  # no heartbeat
    job = await parent.enqueue()
    await asyncio.wait_for(spawned.wait(), 10)
    await app.jobs.pause(ids["paused"])
    assert await kids.claimer.run_once() == 1
    await asyncio.wait_for(slow_started.wait(), 10)
    running = await app.get(ids["running"])
    done_before = await app.wait(ids["done"], timeout=10)
    assert done_before.state is JobState.SUCCEEDED
    finish_parent.set()

    final = await app.wait(job.id, timeout=10)
    expected = JobState.SUCCEEDED if ending == "succeeds" else JobState.FAILED
    assert final.state is expected
    for name in ("queued", "paused", "running"):
        kid = await app.get(ids[name])
        assert (kid.state, kid.cancel_reason) == (JobState.CANCELLED, "parent job completed")
        last = (await app.jobs.events(kid.id))[-1]
        assert (last.to_state, last.reason) == (JobState.CANCELLED, "parent job completed")
    revoked = await app.get(ids["running"])
    assert revoked.lease_token == running.lease_token + 1
    assert revoked.lease_expires_at is None
    assert await app.get(ids["done"]) == done_before, "a finished child is kept unchanged"

    # The running child's handler finishes after its parent did: its result is refused.
    release_slow.set()

    async def slow_finished() -> bool:
        return bool(slow_returned) and not kids.running

    await eventually(slow_finished)
    late = await app.get(ids["running"])
    assert (late.state, late.result, late.lease_token) == (
        JobState.CANCELLED,
        None,
        revoked.lease_token,
    )
    assert JobState.SUCCEEDED not in [e.to_state for e in await app.jobs.events(late.id)]
    # Queued children never run.
    parked_worker = await workers(services=False, queues=("parked",))
    assert await parked_worker.claimer.run_once() == 0
    assert parked_ran == []


# -- a pause request racing the end of a phase --------------------------------------------


@pytest.mark.parametrize("how", ["raise", "return"])
async def test_parent_ending_its_phase_under_a_pause_request_keeps_its_children_and_phase(
    app: App, workers: StartWorker, how: str
) -> None:
    phases: list[str | None] = []

    @app.task(queue="parked")
    async def leaf(ctx: JobContext) -> None:
        return None

    @app.task
    async def parent(ctx: JobContext) -> Any:
        phases.append(ctx.phase)
        if ctx.phase is None:
            for _ in range(2):
                await ctx.spawn(leaf)
            if len(phases) == 1:
                await ctx.cancelled.wait()  # the pause reaches it once the spawns are done
            wait = WaitForChildren(phase="aggregate")
            if how == "raise":
                raise wait
            return wait
        return len(await ctx.children())

    await workers(cancel_grace=5.0)
    job = await parent.enqueue()
    await eventually(lambda: _children_in(app, job.id, 2, JobState.QUEUED))
    await app.jobs.pause(job.id)
    left = await eventually(lambda: _not_running(app, job.id))
    assert left.state is not JobState.FAILED, left.error
    if left.state is JobState.PAUSED:
        await app.jobs.resume(job.id)
    await workers(queues=("parked",))
    done = await app.wait(job.id, timeout=10)
    assert phases == [None, "aggregate"], "the ingest phase must not run twice"
    assert (done.state, done.result) == (JobState.SUCCEEDED, 2)
    assert len(await app.jobs.children(job.id)) == 2
