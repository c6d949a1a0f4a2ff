"""Concurrency keys and resource slots, counted in the database, on both stores."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tether
from tests.helpers import eventually, fast_config
from tests.integration.control_support import StartWorker
from tests.integration.slotapp import build_app
from tether import App, JobState, Worker
from tether.job import LimitInfo

ROOT = Path(__file__).resolve().parents[2]


async def _limit(app: App, name: str) -> LimitInfo:
    (found,) = [lim for lim in await app.queues.limits() if lim.name == name]
    return found


async def _in_state(app: App, job_id: int, state: JobState) -> tether.Job | None:
    job = await app.get(job_id)
    return job if job.state is state else None


class Peak:
    """Counts handlers running at once."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.starts: list[int] = []

    def enter(self, n: int) -> None:
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.starts.append(n)

    def leave(self) -> None:
        self.active -= 1


# -- concurrency keys --------------------------------------------------------------------


async def test_jobs_under_one_key_run_one_at_a_time_in_enqueue_order(
    app: App, workers: StartWorker
) -> None:
    seen = Peak()

    @app.task
    async def serial(ctx: tether.JobContext, n: int) -> int:
        seen.enter(n)
        await asyncio.sleep(0.02)  # the work: long enough for an overlap to show
        seen.leave()
        return n

    jobs = [await serial.options(key="k").enqueue(n=i) for i in range(6)]
    await workers(concurrency=4)
    for job in jobs:
        assert (await app.wait(job.id, timeout=10)).state is JobState.SUCCEEDED
    assert seen.starts == list(range(6))
    assert seen.peak == 1
    finished = [await app.get(j.id) for j in jobs]
    for earlier, later in itertools.pairwise(finished):
        assert earlier.finished_at is not None and later.started_at is not None
        assert earlier.finished_at <= later.started_at, "two jobs of one key overlapped"
    key = await _limit(app, "key:k")
    assert (key.kind, key.capacity, key.used, key.held, key.blocked_reason) == (
        "key",
        1,
        0,
        0,
        None,
    )


async def test_configure_key_with_max_running_two_runs_two_at_once(
    app: App, workers: StartWorker
) -> None:
    gate = asyncio.Event()
    seen = Peak()

    @app.task
    async def pair(ctx: tether.JobContext, n: int) -> int:
        seen.enter(n)
        await gate.wait()
        seen.leave()
        return n

    jobs = [await pair.options(key="k").enqueue(n=i) for i in range(4)]
    await app.queues.configure_key("k", max_running=2)
    worker = await workers(services=False)
    assert await worker.claimer.run_once() == 2
    assert await worker.claimer.run_once() == 0
    key = await _limit(app, "key:k")
    assert (key.capacity, key.used, key.queued) == (2, 2, 2)
    assert key.blocked_reason == "at capacity (2/2 running)"
    await eventually(lambda: _started(seen, 2))
    assert seen.starts == [0, 1]

    gate.set()

    async def all_done() -> bool:
        await worker.claimer.run_once()
        return all(j.state is JobState.SUCCEEDED for j in [await app.get(j.id) for j in jobs])

    await eventually(all_done)
    assert seen.peak == 2
    assert sorted(seen.starts) == [0, 1, 2, 3]
    assert (await _limit(app, "key:k")).used == 0


async def _started(seen: Peak, n: int) -> bool:
    return len(seen.starts) >= n


async def test_max_running_below_one_is_refused(app: App) -> None:
    with pytest.raises(tether.InvalidJobError, match="max_running"):
        await app.queues.configure_key("k", max_running=0)
    assert await app.queues.limits() == []


@pytest.mark.parametrize("release", ["resume", "retry", "cancel_failed", "cancel_paused"])
async def test_a_paused_or_failed_job_blocks_its_key_until_released(
    app: App, workers: StartWorker, release: str
) -> None:
    failing: set[int] = set()
    ran: list[int] = []

    @app.task(max_attempts=1)
    async def step(ctx: tether.JobContext, n: int) -> int:
        ran.append(n)
        if n in failing:
            raise tether.Fail(f"step {n} broke")
        return n

    worker = await workers(services=False)
    first = await step.options(key="k").enqueue(n=1)
    if release in ("resume", "cancel_paused"):
        await app.jobs.pause(first.id)
    else:
        failing.add(1)
        assert await worker.claimer.run_once() == 1
        await eventually(lambda: _in_state(app, first.id, JobState.FAILED))
    second = await step.options(key="k").enqueue(n=2)
    assert await worker.claimer.run_once() == 0, "the held job blocks the key"
    key = await _limit(app, "key:k")
    assert (key.held, key.used, key.queued) == (1, 0, 1)
    assert key.blocked_reason == "1 paused or failed job(s) hold the key"
    assert (await app.get(second.id)).state is JobState.QUEUED

    if release == "resume":
        await app.jobs.resume(first.id)
    elif release == "retry":
        failing.clear()
        await app.jobs.retry(first.id)
    else:
        assert (await app.cancel(first.id)).outcome == "cancelled"
    assert (await _limit(app, "key:k")).held == 0

    expect_first = JobState.CANCELLED if release.startswith("cancel") else JobState.SUCCEEDED

    async def settled() -> bool:
        await worker.claimer.run_once()
        return (await app.get(second.id)).state is JobState.SUCCEEDED and (
            await app.get(first.id)
        ).state is expect_first

    await eventually(settled)
    key = await _limit(app, "key:k")
    assert (key.held, key.used, key.blocked_reason) == (0, 0, None)
    assert 2 in ran


async def test_block_on_hold_false_lets_jobs_run_past_a_held_job(
    app: App, workers: StartWorker
) -> None:
    @app.task
    async def step(ctx: tether.JobContext, n: int) -> int:
        return n

    await app.queues.configure_key("k", block_on_hold=False)
    worker = await workers(services=False)
    first = await step.options(key="k").enqueue(n=1)
    await app.jobs.pause(first.id)
    second = await step.options(key="k").enqueue(n=2)
    key = await _limit(app, "key:k")
    assert (key.held, key.block_on_hold, key.blocked_reason) == (1, False, None)
    assert await worker.claimer.run_once() == 1
    assert (await app.wait(second.id, timeout=10)).state is JobState.SUCCEEDED
    assert (await app.get(first.id)).state is JobState.PAUSED


async def test_a_job_failed_over_budget_can_be_dismissed_to_unblock_its_key(
    app: App, workers: StartWorker
) -> None:
    @app.task
    async def spender(ctx: tether.JobContext, cost: int) -> int:
        ctx.report_usage(cost)
        if ctx.cancelled:
            ctx.check_cancelled()
        return cost

    await workers()
    costly = await spender.options(key="k", budget=10).enqueue(cost=50)
    await eventually(lambda: _in_state(app, costly.id, JobState.PAUSED))
    after_budget = await app.cancel(costly.id)
    assert after_budget.outcome == "failed_over_budget"
    assert (await _limit(app, "key:k")).held == 1, "a failed job holds its key"
    nxt = await spender.options(key="k").enqueue(cost=1)

    await app.cancel(costly.id, reason="dismiss")  # a person dismisses the failed job
    assert (await app.get(costly.id)).state is JobState.CANCELLED
    assert (await _limit(app, "key:k")).held == 0
    assert (await app.wait(nxt.id, timeout=10)).state is JobState.SUCCEEDED


# -- resource slots ----------------------------------------------------------------------


async def test_a_resource_pool_never_runs_more_jobs_than_its_capacity(
    app: App, workers: StartWorker
) -> None:
    app.resource("repo", capacity=2)
    seen = Peak()

    @app.task(resources=["repo"])
    async def checkout(ctx: tether.JobContext, n: int) -> int:
        seen.enter(n)
        await asyncio.sleep(0.02)  # the work: long enough for an overlap to show
        seen.leave()
        return n

    jobs = [await checkout.enqueue(n=i) for i in range(6)]
    repo = await _limit(app, "resource:repo")
    assert (repo.kind, repo.capacity, repo.used) == ("resource", 2, 0)
    await workers(concurrency=6)
    for job in jobs:
        assert (await app.wait(job.id, timeout=10)).state is JobState.SUCCEEDED
    assert seen.peak == 2
    assert sorted(seen.starts) == list(range(6))
    assert (await _limit(app, "resource:repo")).used == 0


async def test_resource_slots_are_released_on_success_failure_and_cancellation(
    app: App, workers: StartWorker
) -> None:
    app.resource("repo", capacity=1)
    started = asyncio.Event()

    @app.task(resources=["repo"], max_attempts=1)
    async def use(ctx: tether.JobContext, how: str) -> str:
        if how == "fail":
            raise RuntimeError("broken checkout")
        if how == "hang":
            started.set()
            await ctx.cancelled.wait()
            ctx.check_cancelled()
        return how

    await workers()
    ok = await app.wait((await use.enqueue(how="ok")).id, timeout=10)
    assert ok.state is JobState.SUCCEEDED and ok.limits == ("resource:repo",)
    assert (await _limit(app, "resource:repo")).used == 0
    failed = await app.wait((await use.enqueue(how="fail")).id, timeout=10)
    assert failed.state is JobState.FAILED
    assert (await _limit(app, "resource:repo")).used == 0, "a failure releases the slot"
    hung = await use.enqueue(how="hang")
    await asyncio.wait_for(started.wait(), 10)
    assert (await _limit(app, "resource:repo")).used == 1
    result = await app.cancel(hung.id)
    assert result.outcome == "cancelled"
    assert result.slots_released == ["resource:repo"]
    assert (await _limit(app, "resource:repo")).used == 0
    after = await app.wait((await use.enqueue(how="ok")).id, timeout=10)
    assert after.state is JobState.SUCCEEDED, "the freed slot is usable"


def test_an_unknown_resource_is_a_config_error(db_url: str) -> None:
    app = App(db_url)
    app.resource("repo", capacity=1)

    with pytest.raises(tether.ConfigError, match="unknown resource"):

        @app.task(resources=["repo", "gpu"])
        async def needs_gpu(ctx: tether.JobContext) -> None:
            return None

    assert app.tasks == {}
    with pytest.raises(tether.ConfigError):
        app.resource("gpu", capacity=0)


@pytest.fixture
def slot_worker(db_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process (``tests.integration.slotapp``) whose jobs hang."""
    env = {**os.environ, "TETHER_DATABASE_URL": db_url, "SLOTAPP_HANG": "1"}
    with open(tmp_path / "slotapp.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.slotapp"], cwd=ROOT, env=env, stderr=log
        )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


async def test_slot_of_a_sigkilled_worker_is_freed_by_rescue_and_the_next_job_runs(
    db_url: str, slot_worker: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLOTAPP_HANG", raising=False)  # jobs here finish at once
    app = build_app(db_url)
    try:
        first = await app.enqueue("hold")
        second = await app.enqueue("hold")
        running = await eventually(
            lambda: _in_state(app, first.id, JobState.RUNNING), timeout=30, every=0.05
        )
        assert (await _limit(app, "resource:repo")).used == 1
        assert (await app.get(second.id)).state is JobState.QUEUED, "no slot left for it"
        slot_worker.send_signal(signal.SIGKILL)
        await asyncio.to_thread(slot_worker.wait, 10)
        assert (await _limit(app, "resource:repo")).used == 1, "the dead worker's slot"

        heir = Worker(app, fast_config())
        await heir.start(services=False)  # may already rescue it while opening

        async def rescued() -> tether.Job | None:
            # PostgreSQL: once this process leads maintenance
            await heir.maintenance.rescuer.run_once()
            return await _in_state(app, first.id, JobState.RETRYING)

        try:
            await eventually(rescued)
            assert (await _limit(app, "resource:repo")).used == 0
            events = await app.jobs.events(first.id)
            assert (events[-1].actor, events[-1].reason) == ("rescuer", "worker dead")

            assert await heir.claimer.run_once() == 1
            # The job that waited longest takes the freed slot.
            assert (await app.get(second.id)).state in (JobState.RUNNING, JobState.SUCCEEDED)

            async def both_done() -> bool:
                await heir.claimer.run_once()
                states = {(await app.get(j.id)).state for j in (first, second)}
                return states == {JobState.SUCCEEDED}

            await eventually(both_done)
        finally:
            await heir.stop()
        final = await app.get(first.id)
        assert (final.result, final.attempt) == (2, 2)
        assert final.lease_token > running.lease_token
        assert (await _limit(app, "resource:repo")).used == 0
    finally:
        await app.close()
