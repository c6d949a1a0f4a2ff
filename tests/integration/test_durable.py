"""Durable steps, sleeps, waits for signals and fenced effects, run by real workers on
both stores."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
import pytest

import tether
from tests.helpers import eventually
from tests.integration.control_support import StartWorker
from tether import App, JobState
from tether.errors import (
    DuplicateStepError,
    IllegalTransitionError,
    SignalConflictError,
    SignalTimeoutError,
)


def _table(app: App) -> None:
    """A table of the user's own, in tether's database."""
    sql = "CREATE TABLE IF NOT EXISTS ledger (job_id BIGINT, attempt INT, note TEXT)"
    if app.url.startswith("sqlite"):
        from tether.store import parse_sqlite_path

        with sqlite3.connect(parse_sqlite_path(app.url)) as conn:
            conn.execute(sql)
    else:
        with psycopg.connect(app.url, autocommit=True) as conn:
            conn.execute(sql)


def _ledger(app: App) -> list[tuple[Any, ...]]:
    sql = "SELECT job_id, attempt, note FROM ledger ORDER BY job_id, attempt, note"
    if app.url.startswith("sqlite"):
        from tether.store import parse_sqlite_path

        with sqlite3.connect(parse_sqlite_path(app.url)) as conn:
            return list(conn.execute(sql).fetchall())
    with psycopg.connect(app.url, autocommit=True) as conn:
        return list(conn.execute(sql).fetchall())


async def _insert(conn: Any, job_id: int, attempt: int, note: str) -> None:
    sql = "INSERT INTO ledger (job_id, attempt, note) VALUES (%s, %s, %s)"
    if isinstance(conn, sqlite3.Connection):
        conn.execute(sql.replace("%s", "?"), (job_id, attempt, note))
    else:
        await conn.execute(sql, (job_id, attempt, note))


async def _parked(app: App, job_id: int, step: str) -> tether.Job | None:
    """The job, once it is parked in ``step`` (queued, the step waiting)."""
    steps = {s.name: s.state for s in await app.durable.steps(job_id)}
    job = await app.get(job_id)
    return job if job.state is JobState.QUEUED and steps.get(step) == "waiting" else None


async def test_a_retried_job_runs_only_the_steps_it_had_not_finished(
    app: App, workers: StartWorker
) -> None:
    ran: list[tuple[int, str]] = []

    @app.task(max_attempts=3)
    async def pipeline(ctx: tether.JobContext) -> list[Any]:
        out = []
        for i in range(4):

            async def work(i: int = i) -> dict[str, int]:
                ran.append((ctx.attempt, f"s{i}"))
                if i == 2 and ctx.attempt == 1:
                    raise RuntimeError("flaky step")
                return {"i": i}

            out.append(await ctx.step(f"s{i}", work))
        return out

    job = await pipeline.enqueue()
    await workers()
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED
    assert done.result == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}]
    assert ran == [(1, "s0"), (1, "s1"), (1, "s2"), (2, "s2"), (2, "s3")]
    steps = await app.durable.steps(job.id)
    assert [(s.name, s.state, s.attempt) for s in steps] == [
        ("s0", "done", 1),
        ("s1", "done", 1),
        ("s2", "done", 2),
        ("s3", "done", 2),
    ]


async def test_a_step_name_used_twice_in_one_run_is_a_clear_error(
    app: App, workers: StartWorker
) -> None:
    @app.task(max_attempts=1)
    async def twice(ctx: tether.JobContext) -> None:
        await ctx.step("same", lambda: 1)
        with pytest.raises(DuplicateStepError, match="already used"):
            await ctx.step("same", lambda: 2)

    job = await twice.enqueue()
    await workers()
    assert (await app.wait(job.id, timeout=20)).state is JobState.SUCCEEDED


async def test_a_sleeping_job_holds_no_lease_and_spends_no_attempt(
    app: App, workers: StartWorker
) -> None:
    @app.task(max_attempts=1)
    async def napper(ctx: tether.JobContext) -> int:
        first = await ctx.step("before", lambda: ctx.attempt)
        await ctx.sleep(0.5)
        return int(first) + 10

    job = await napper.enqueue()
    await workers()

    asleep = await eventually(lambda: _parked(app, job.id, "sleep:1"), timeout=10)
    assert asleep.lease_expires_at is None and asleep.attempt == 0
    assert "sleeping until" in ((await app.jobs.events(job.id))[-1].reason or "")
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.result == 11
    assert done.attempt == 1
    steps = {s.name: s for s in await app.durable.steps(job.id)}
    assert steps["sleep:1"].kind == "sleep" and steps["sleep:1"].state == "done"


async def test_a_signal_sent_before_the_wait_is_delivered_when_it_comes(
    app: App, workers: StartWorker
) -> None:
    @app.task
    async def approve(ctx: tether.JobContext) -> Any:
        return await ctx.wait_for("approval")

    job = await approve.enqueue()
    assert await app.durable.signal(job.id, "approval", {"ok": True}) == "kept"
    assert await app.durable.signal(job.id, "approval", {"ok": True}) == "duplicate"
    with pytest.raises(SignalConflictError):
        await app.durable.signal(job.id, "approval", {"ok": False})
    await workers()
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.result == {"ok": True}
    with pytest.raises(IllegalTransitionError, match="succeeded"):
        await app.durable.signal(job.id, "late", 1)


async def test_a_waiting_job_is_parked_until_its_signal_wakes_it(
    app: App, workers: StartWorker
) -> None:
    @app.task(max_attempts=1)
    async def approve(ctx: tether.JobContext) -> Any:
        payload = await ctx.wait_for("approval")
        return {"got": payload, "attempt": ctx.attempt}

    job = await approve.enqueue()
    await workers()

    await eventually(lambda: _parked(app, job.id, "signal:approval"), timeout=10)
    last = (await app.jobs.events(job.id))[-1]
    assert "waiting for signal 'approval'" in (last.reason or "")
    (step,) = await app.durable.steps(job.id)
    assert (step.name, step.kind, step.state) == ("signal:approval", "signal", "waiting")
    assert await app.durable.signal(job.id, "approval", "yes") == "woke"
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED
    assert done.result == {"got": "yes", "attempt": 1}


async def test_a_wait_past_its_timeout_raises_in_the_handler(
    app: App, workers: StartWorker
) -> None:
    @app.task(max_attempts=1)
    async def impatient(ctx: tether.JobContext) -> str:
        try:
            await ctx.wait_for("approval", timeout=0.3)
        except SignalTimeoutError:
            return "timed out"
        return "approved"

    job = await impatient.enqueue()
    await workers()
    done = await app.wait(job.id, timeout=20)
    assert done.result == "timed out"
    with pytest.raises(IllegalTransitionError):
        await app.durable.signal(job.id, "approval", True)


async def test_a_cancel_reaches_a_sleeping_job(app: App, workers: StartWorker) -> None:
    @app.task
    async def long_nap(ctx: tether.JobContext) -> None:
        await ctx.sleep(3600)

    job = await long_nap.enqueue()
    await workers()

    await eventually(lambda: _parked(app, job.id, "sleep:1"), timeout=10)
    result = await app.cancel(job.id, wait=5)
    assert (await app.get(job.id)).state is JobState.CANCELLED, result


async def test_fenced_transaction_commits_once_with_its_step(
    app: App, workers: StartWorker
) -> None:
    _table(app)

    @app.task(max_attempts=3)
    async def pay(ctx: tether.JobContext) -> str:
        async def charge() -> str:
            async with ctx.transaction() as conn:
                await _insert(conn, ctx.id, ctx.attempt, "charged")
            return "receipt"

        receipt = await ctx.step("charge", charge)
        if ctx.attempt == 1:
            raise RuntimeError("crash after the charge")
        return str(receipt)

    job = await pay.enqueue()
    await workers()
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.attempt == 2
    assert _ledger(app) == [(job.id, 1, "charged")]


async def test_a_step_that_raises_rolls_its_transaction_back(
    app: App, workers: StartWorker
) -> None:
    _table(app)

    @app.task(max_attempts=2)
    async def flaky(ctx: tether.JobContext) -> None:
        async def write() -> None:
            async with ctx.transaction() as conn:
                await _insert(conn, ctx.id, ctx.attempt, "write")
            if ctx.attempt == 1:
                raise RuntimeError("after the write, inside the step")

        await ctx.step("write", write)

    job = await flaky.enqueue()
    await workers()
    assert (await app.wait(job.id, timeout=20)).state is JobState.SUCCEEDED
    assert _ledger(app) == [(job.id, 2, "write")]


async def test_a_sync_handler_gets_steps_and_fenced_transactions(
    app: App, workers: StartWorker
) -> None:
    _table(app)

    @app.task(max_attempts=2)
    def sync_pay(ctx: tether.SyncJobContext) -> int:
        def charge() -> int:
            with ctx.transaction() as conn:
                sql = "INSERT INTO ledger (job_id, attempt, note) VALUES (%s, %s, 'sync')"
                if isinstance(conn, sqlite3.Connection):
                    conn.execute(sql.replace("%s", "?"), (ctx.id, ctx.attempt))
                else:
                    conn.execute(sql, (ctx.id, ctx.attempt))
            return 7

        value = int(ctx.step("charge", charge))
        if ctx.attempt == 1:
            raise RuntimeError("crash after the charge")
        return value

    job = await sync_pay.enqueue()
    await workers()
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.result == 7
    assert _ledger(app) == [(job.id, 1, "sync")]


async def test_the_step_decorator_runs_once_per_job(app: App, workers: StartWorker) -> None:
    calls: list[int] = []

    @tether.step()
    async def fetch(n: int) -> int:
        calls.append(n)
        return n * 2

    @app.task(max_attempts=2)
    async def uses(ctx: tether.JobContext) -> int:
        value = int(await fetch(21))
        if ctx.attempt == 1:
            raise RuntimeError("again")
        return value

    job = await uses.enqueue()
    await workers()
    done = await app.wait(job.id, timeout=20)
    assert done.result == 42 and calls == [21]


async def test_pause_and_resume_act_on_a_waiting_job_as_on_a_queued_one(
    app: App, workers: StartWorker
) -> None:
    @app.task(max_attempts=1)
    async def approve(ctx: tether.JobContext) -> Any:
        return await ctx.wait_for("approval")

    job = await approve.enqueue()
    await workers()
    await eventually(lambda: _parked(app, job.id, "signal:approval"), timeout=10)
    assert (await app.jobs.pause(job.id)).state is JobState.PAUSED
    # A signal to a paused waiter is kept; the job runs once it is resumed.
    assert await app.durable.signal(job.id, "approval", "go") == "woke"
    assert (await app.get(job.id)).state is JobState.PAUSED
    await app.jobs.resume(job.id)
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.result == "go" and done.attempt == 1


async def test_a_cancel_cascades_to_a_sleeping_child(app: App, workers: StartWorker) -> None:
    @app.task
    async def child(ctx: tether.JobContext) -> None:
        await ctx.sleep(3600)

    @app.task
    async def parent(ctx: tether.JobContext) -> None:
        if ctx.phase is None:
            await ctx.spawn(child)
            raise tether.WaitForChildren("done")

    job = await parent.enqueue()
    await workers()

    async def sleeping_child() -> tether.Job | None:
        kids = await app.jobs.children(job.id)
        return await _parked(app, kids[0].id, "sleep:1") if kids else None

    kid = await eventually(sleeping_child, timeout=10)
    await app.cancel(job.id, wait=5)
    assert (await app.get(kid.id)).state is JobState.CANCELLED
    assert (await app.get(job.id)).state is JobState.CANCELLED


async def test_sleeps_and_waits_survive_a_restart_of_every_worker(
    app: App, workers: StartWorker
) -> None:
    ran: list[str] = []

    @app.task(max_attempts=1)
    async def journey(ctx: tether.JobContext) -> Any:
        await ctx.step("first", lambda: ran.append("first"))
        await ctx.sleep(1.0)
        await ctx.step("second", lambda: ran.append("second"))
        return await ctx.wait_for("go")

    job = await journey.enqueue()
    first = await workers()
    await eventually(lambda: _parked(app, job.id, "sleep:1"), timeout=10)
    store = await app.store()
    assert (await store.get(job.id)).lease_expires_at is None  # type: ignore[union-attr]
    await first.stop()
    await workers()
    await eventually(lambda: _parked(app, job.id, "signal:go"), timeout=20)
    assert (await app.get(job.id)).lease_expires_at is None
    assert await app.durable.signal(job.id, "go", 5) == "woke"
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.result == 5 and done.attempt == 1
    assert ran == ["first", "second"]


async def test_a_budget_pauses_a_job_whose_steps_report_usage(
    app: App, workers: StartWorker
) -> None:
    @app.task(max_attempts=1)
    async def spender(ctx: tether.JobContext) -> None:
        for i in range(5):

            async def call(i: int = i) -> int:
                ctx.report_usage(40)
                return i

            await ctx.step(f"call:{i}", call)
            ctx.check_cancelled()  # the budget's pause is asked for as the usage passes it

    job = await spender.options(budget=100).enqueue()
    await workers()

    async def paused() -> tether.Job | None:
        found = await app.get(job.id)
        return found if found.state is JobState.PAUSED else None

    await eventually(paused, timeout=20)
    steps = await app.durable.steps(job.id)
    assert [(s.name, s.usage) for s in steps] == [("call:0", 40), ("call:1", 40), ("call:2", 40)]


async def test_usage_reported_before_a_sleep_is_kept_and_counts_against_the_budget(
    app: App, workers: StartWorker
) -> None:
    @app.task(max_attempts=1)
    async def costly(ctx: tether.JobContext) -> None:
        # Usage is reported in steps: code outside them runs again on every replay.
        await ctx.step("first", ctx.report_usage, 30)
        await ctx.sleep(0.2)  # the usage is not yet carried by a heartbeat: the park does
        await ctx.step("second", ctx.report_usage, 30)
        await ctx.sleep(0.2, name="again")  # over the budget: paused, not parked

    job = await costly.options(budget=50).enqueue()
    await workers(heartbeat_interval=5.0, lease_duration=20.0)

    async def paused() -> tether.Job | None:
        found = await app.get(job.id)
        return found if found.state is JobState.PAUSED else None

    stopped = await eventually(paused, timeout=20)
    assert stopped.usage == 60 and "budget" in (stopped.pause_reason or "")
    steps = {s.name: (s.state, s.usage) for s in await app.durable.steps(job.id)}
    assert steps == {"first": ("done", 30), "sleep:1": ("done", 0), "second": ("done", 30)}


async def test_steps_and_waits_are_counted_in_metrics(app: App, workers: StartWorker) -> None:
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    @app.task(max_attempts=2)
    async def counted(ctx: tether.JobContext) -> None:
        await ctx.step("one", lambda: 1)
        await ctx.sleep(0.1)
        if ctx.attempt == 1:
            raise RuntimeError("again")

    task = counted.name
    before = {
        "ran": sample("tether_steps_total", task=task, outcome="ran"),
        "replayed": sample("tether_steps_total", task=task, outcome="replayed"),
        "parked": sample("tether_waits_total", kind="sleep", outcome="parked"),
        "done": sample("tether_waits_total", kind="sleep", outcome="done"),
    }
    job = await counted.enqueue()
    await workers()
    assert (await app.wait(job.id, timeout=20)).state is JobState.SUCCEEDED
    # Attempt 1: runs "one", parks, wakes (replays "one"), the sleep is over, fails;
    # attempt 2 replays "one" and finds the sleep over.
    assert sample("tether_steps_total", task=task, outcome="ran") == before["ran"] + 1
    assert sample("tether_steps_total", task=task, outcome="replayed") == before["replayed"] + 2
    assert sample("tether_waits_total", kind="sleep", outcome="parked") == before["parked"] + 1
    assert sample("tether_waits_total", kind="sleep", outcome="done") == before["done"] + 1
