"""The control plane on both stores, with real workers: cancellation records and their
edge cases, escalation, wait_cancelled, pause and resume, queue pauses, budgets and
artifacts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

import tether
from tests.helpers import eventually, fast_config
from tests.integration.control_support import StartWorker, artifact_names, assert_one_runner
from tether import App, AppConfig, JobState, Worker
from tether.cancellation import CancellationService

STEPS = ["request", "stop_runners", "update_tasks", "clean_resources"]
RESULT_KEYS = {
    "tasks_cancelled",
    "tasks_completed",
    "tasks_failed",
    "runners_terminated",
    "slots_released",
    "artifacts_preserved",
    "dependents_blocked",
    "errors",
    "duration_seconds",
}


async def forever() -> None:
    """Wait until cancelled."""
    await asyncio.Event().wait()


async def _in_state(app: App, job_id: int, state: JobState) -> tether.Job | None:
    job = await app.get(job_id)
    return job if job.state is state else None


async def _record(app: App, job_id: int) -> tether.CancellationRecord | None:
    return await app.cancellations.get(job_id)


async def _record_in(app: App, job_id: int, status: str) -> tether.CancellationRecord | None:
    record = await app.cancellations.get(job_id)
    return record if record is not None and record.status == status else None


def _steps_are_timed(record: tether.CancellationRecord) -> None:
    for step in record.steps:
        assert step.started_at and step.completed_at, step
        assert step.started_at <= step.completed_at, step  # same ISO format, UTC


# -- the cancellation service ------------------------------------------------------------


async def test_cancelling_a_running_job_persists_a_completed_record_with_every_step(
    app: App, workers: StartWorker
) -> None:
    app.resource("repo", capacity=1)
    started = asyncio.Event()
    seen: list[str] = []

    @app.task(resources=["repo"])
    async def deaf(ctx: tether.JobContext) -> None:
        await ctx.save_artifact("partial.txt", b"half done")
        started.set()
        await ctx.cancelled.wait()
        seen.append(f"signal:{ctx.cancelled.reason}")
        try:
            await forever()  # ignores the signal: escalation must end it
        except asyncio.CancelledError:
            seen.append("CancelledError")
            raise

    worker = await workers(cancel_grace=0.2)
    job = await deaf.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    result = await app.cancel(job.id, reason="operator said stop", actor="alice")

    assert (result.status, result.success, result.outcome) == ("completed", True, "cancelled")
    assert result.cancellation_id.startswith("cancel-")
    assert result.tasks_cancelled == [job.id]
    assert result.tasks_completed == [] and result.tasks_failed == []
    assert_one_runner(result, worker, "task_cancelled")
    assert result.slots_released == ["resource:repo"]
    assert artifact_names(result.artifacts_preserved) == ["partial.txt"]
    assert result.errors == []
    assert result.duration_seconds > 0
    assert [s.name for s in result.steps] == STEPS
    assert seen == ["signal:cancel", "CancelledError"]
    assert (result.job.state, result.job.stopped_by) == (JobState.CANCELLED, "task_cancelled")

    record = await app.cancellations.get(job.id)
    assert record is not None and record.settled
    assert (record.id, record.job_id, record.status) == (
        result.cancellation_id,
        job.id,
        "completed",
    )
    assert (record.reason, record.force, record.initiated_by) == (
        "operator said stop",
        False,
        "alice",
    )
    assert record.completed_at is not None and record.completed_at >= record.initiated_at
    assert [(s.name, s.status) for s in record.steps] == [(n, "completed") for n in STEPS]
    _steps_are_timed(record)
    details = {s.name: s.details for s in record.steps}
    assert details["request"]["state_before"] == "running"
    assert details["request"]["state_after"] == "cancelling"
    assert details["stop_runners"]["runners_terminated"] == result.runners_terminated
    update = details["update_tasks"]
    assert (update["cancelled"], update["completed"], update["failed"]) == ([job.id], [], [])
    assert details["clean_resources"]["slots_released"] == ["resource:repo"]
    assert details["clean_resources"]["artifacts_preserved"] == result.artifacts_preserved
    assert record.result is not None and set(record.result.to_json()) == RESULT_KEYS
    assert record.result.tasks_cancelled == [job.id]
    assert record.error is None
    assert [c.id for c in await app.cancellations.list()] == [record.id]
    (repo,) = [lim for lim in await app.queues.limits() if lim.name == "resource:repo"]
    assert repo.used == 0


async def test_a_cancel_reaches_the_handler_from_its_notification_before_any_heartbeat(
    app: App, workers: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, seen = asyncio.Event(), asyncio.Event()

    @app.task
    async def listens(ctx: tether.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        seen.set()
        await forever()

    worker = await workers()
    job = await listens.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    # From now on no heartbeat answers until the handler has seen the request: only the
    # notification of the committed request can have told the worker.
    gate = asyncio.Event()
    real = worker.store.heartbeat

    async def held(*args: object) -> object:
        await gate.wait()
        return await real(*args)

    monkeypatch.setattr(worker.store, "heartbeat", held)
    try:
        await app.cancel(job.id, reason="now", wait=0)
        await asyncio.wait_for(seen.wait(), 10)
    finally:
        gate.set()
    assert (await app.wait(job.id, timeout=10)).state is JobState.CANCELLED


async def test_cancelling_a_queued_job_records_completed_with_stop_runners_skipped(
    app: App,
) -> None:
    @app.task
    async def idle(ctx: tether.JobContext) -> None:
        return None

    job = await idle.enqueue()
    result = await app.cancel(job.id, reason="not needed")
    assert (result.status, result.outcome, result.job.state) == (
        "completed",
        "cancelled",
        JobState.CANCELLED,
    )
    assert result.runners_terminated == [] and result.slots_released == []
    assert result.tasks_cancelled == [job.id]
    record = await app.cancellations.get(job.id)
    assert record is not None and record.status == "completed"
    assert [(s.name, s.status) for s in record.steps] == [
        ("request", "completed"),
        ("stop_runners", "skipped"),
        ("update_tasks", "completed"),
        ("clean_resources", "completed"),
    ]
    _steps_are_timed(record)
    request = record.steps[0].details
    assert (request["state_before"], request["state_after"]) == ("queued", "cancelled")


async def test_cancelling_a_succeeded_job_is_refused_and_leaves_no_record(
    app: App, workers: StartWorker
) -> None:
    @app.task
    async def fine(ctx: tether.JobContext) -> int:
        return 1

    await workers()
    done = await app.wait((await fine.enqueue()).id, timeout=10)
    with pytest.raises(tether.IllegalTransitionError, match="it is succeeded"):
        await app.cancel(done.id)
    assert await app.get(done.id) == done
    assert await app.cancellations.get(done.id) is None
    assert await app.cancellations.list() == []


async def test_cancelling_an_unknown_job_raises_job_not_found_and_records_nothing(
    app: App,
) -> None:
    @app.task
    async def idle(ctx: tether.JobContext) -> None:
        return None

    with pytest.raises(tether.JobNotFoundError):
        await app.cancel(424242)
    with pytest.raises(tether.JobNotFoundError):
        await app.cancellations.get(424242)
    with pytest.raises(tether.JobNotFoundError):
        await app.cancellations.wait(424242, timeout=0.1)
    assert await app.cancellations.list() == []
    assert sum((await app.jobs.stats()).values()) == 0


async def test_a_forced_second_request_escalates_the_cancellation_in_progress(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()

    @app.task
    async def slow_to_stop(ctx: tether.JobContext) -> None:
        started.set()
        await asyncio.sleep(3600)  # ignores the signal; only its task being cancelled ends it

    await workers(cancel_grace=30.0)
    job = await slow_to_stop.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    first = asyncio.create_task(app.cancel(job.id, reason="first", wait=20))
    await eventually(lambda: _record_in(app, job.id, "stopping_runners"))
    second = await app.cancel(job.id, reason="hurry", force=True, wait=20)
    r1 = await first
    assert r1.cancellation_id == second.cancellation_id
    assert (r1.outcome, second.outcome) == ("cancelled", "cancelled")
    assert (await app.get(job.id)).stopped_by == "task_cancelled"


async def test_second_cancel_while_the_first_is_in_progress_shares_its_record(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task
    async def slow_to_stop(ctx: tether.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        await release.wait()  # cleaning up takes a while
        ctx.check_cancelled()

    await workers(cancel_grace=30.0)
    job = await slow_to_stop.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    first = asyncio.create_task(app.cancel(job.id, reason="first", wait=20))
    await eventually(lambda: _record_in(app, job.id, "stopping_runners"))
    second = asyncio.create_task(app.cancel(job.id, reason="second", wait=20))
    done, _ = await asyncio.wait({second}, timeout=0.3)
    assert not done, "the second request waits for the first one's record to settle"
    release.set()
    r1, r2 = await asyncio.gather(first, second)
    assert r1.cancellation_id == r2.cancellation_id
    assert (r1.status, r2.status) == ("completed", "completed")
    assert (r1.outcome, r2.outcome) == ("cancelled", "cancelled")
    records = [c for c in await app.cancellations.list() if c.job_id == job.id]
    assert [(c.id, c.reason, c.force) for c in records] == [(r1.cancellation_id, "first", False)]
    final = await app.get(job.id)
    assert (final.state, final.cancel_reason) == (JobState.CANCELLED, "first")


async def test_five_concurrent_cancels_of_one_running_job_make_exactly_one_record(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()

    @app.task
    async def polite(ctx: tether.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        ctx.check_cancelled()

    await workers()
    job = await polite.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    results = await asyncio.gather(
        *(app.cancel(job.id, reason=f"caller {i}", wait=10) for i in range(5))
    )
    assert len({r.cancellation_id for r in results}) == 1
    assert all(r.cancellation_id for r in results)
    assert {(r.status, r.outcome) for r in results} == {("completed", "cancelled")}
    records = await app.cancellations.list()
    assert [c.id for c in records] == [results[0].cancellation_id]
    assert (await app.get(job.id)).state is JobState.CANCELLED
    terminal = [e for e in await app.jobs.events(job.id) if e.to_state is JobState.CANCELLED]
    assert len(terminal) == 1


async def test_repeated_cancel_with_the_same_request_id_returns_the_same_record(
    app: App,
) -> None:
    @app.task
    async def idle(ctx: tether.JobContext) -> None:
        return None

    job = await idle.enqueue()
    first = await app.cancel(job.id, reason="once", request_id="req-1")
    again = await app.cancel(job.id, reason="twice", request_id="req-1")
    assert first.cancellation_id and again.cancellation_id == first.cancellation_id
    assert again.status == "completed"
    assert again.outcome in ("cancelled", "already_cancelled")
    assert again.job.state is JobState.CANCELLED
    records = await app.cancellations.list()
    assert [(c.id, c.request_id, c.reason) for c in records] == [
        (first.cancellation_id, "req-1", "once")
    ]
    # A plain repeat (no request id) also answers with the job's one record.
    plain = await app.cancel(job.id)
    assert plain.cancellation_id == first.cancellation_id
    assert len(await app.cancellations.list()) == 1


async def test_request_id_of_another_jobs_cancellation_is_refused_at_once(app: App) -> None:
    @app.task
    async def idle(ctx: tether.JobContext) -> None:
        return None

    a = await idle.enqueue()
    b = await idle.enqueue()
    await app.cancel(a.id, request_id="req-1")
    try:
        answer: object = await asyncio.wait_for(app.cancel(b.id, request_id="req-1", wait=1), 5)
    except tether.TetherError as exc:  # a clear refusal is a fine answer
        answer = exc
    # Either a clear refusal that changes nothing, or a real cancellation of b.
    b_after = await app.get(b.id)
    if isinstance(answer, tether.TetherError):
        assert b_after.state is JobState.QUEUED
    else:
        assert isinstance(answer, tether.CancellationResult)
        assert answer.job_id == b.id and b_after.state is JobState.CANCELLED


async def test_cancel_that_outlasts_its_wait_is_partial_and_the_job_still_ends_cancelled(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()

    @app.task
    async def deaf(ctx: tether.JobContext) -> None:
        started.set()
        await forever()

    await workers(cancel_grace=1.0)
    job = await deaf.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    result = await app.cancel(job.id, wait=0.1)
    assert (result.status, result.success, result.outcome) == ("partial", False, "requested")
    assert result.cancelled, "it will not run again"
    assert len(result.errors) == 1 and "still running after" in result.errors[0]
    stop = next(s for s in result.steps if s.name == "stop_runners")
    assert stop.status == "failed" and stop.error == result.errors[0]
    assert result.slots_released == []
    # Waiting waits until the job has stopped; the error that resolved is not current.
    assert await app.cancellations.wait(job.id, timeout=10) == (True, [])
    final = await app.get(job.id)
    assert (final.state, final.stopped_by) == (JobState.CANCELLED, "task_cancelled")
    record = await app.cancellations.get(job.id)
    assert record is not None and record.status == "completed"
    follow = record.steps[-1]
    assert (follow.name, follow.details["ended"]) == ("follow_up", {str(job.id): "cancelled"})
    assert record.error is None and record.result is not None
    assert record.result.errors == [] and record.result.tasks_cancelled == [job.id]
    assert any("(task_cancelled)" in r for r in record.result.runners_terminated or [])
    assert await app.cancellations.wait(job.id, timeout=1) == (True, [])


async def test_follow_up_keeps_other_errors_and_follows_up_once(app: App) -> None:
    @app.task
    async def idle(ctx: tether.JobContext) -> None:
        return None

    store = await app.store()
    job = await idle.enqueue()
    await app.cancel(job.id)  # a record and a cancelled job; now make the record partial
    record = await app.cancellations.get(job.id)
    assert record is not None
    still = f"job {job.id} still running after 0s; it cannot run again"
    other = "job 99's handler ignored cancellation and was abandoned"
    steps = [
        {"name": "stop_runners", "status": "failed", "started_at": "t", "completed_at": "t",
         "details": {"runners_terminated": [], "still_running": [job.id]}, "error": still},
    ]  # fmt: skip
    await store.update_cancellation(
        record.id,
        status="partial",
        steps=steps,
        result={"errors": [still, other]},
        error=f"{still}; {other}",
        final=True,
    )
    service = CancellationService(store, poll_interval=0.05)
    assert await service.follow_up() == [record.id]
    assert await service.follow_up() == []  # once only, though it stays partial
    after = await app.cancellations.get(job.id)
    assert after is not None and after.status == "partial" and after.error == other
    assert [s.name for s in after.steps] == ["stop_runners", "follow_up"]
    assert after.result is not None and after.result.tasks_cancelled == [job.id]


# -- escalation --------------------------------------------------------------------------


async def test_async_job_ignoring_cancel_gets_cancelled_error_after_the_grace(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()
    seen: list[str] = []

    @app.task
    async def deaf(ctx: tether.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        seen.append(f"signal:{ctx.cancelled.reason}")
        try:
            await forever()  # ignores the signal
        except asyncio.CancelledError:
            seen.append("CancelledError")
            raise

    worker = await workers(cancel_grace=0.2)
    job = await deaf.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    result = await app.cancel(job.id, wait=10)
    assert seen == ["signal:cancel", "CancelledError"]
    assert (result.status, result.outcome, result.errors) == ("completed", "cancelled", [])
    assert_one_runner(result, worker, "task_cancelled")
    assert (result.job.state, result.job.stopped_by) == (JobState.CANCELLED, "task_cancelled")
    assert result.job.error == "cancelled while running (stopped: task_cancelled)"


async def test_thread_job_ignoring_cancel_is_abandoned_and_its_late_writes_do_not_land(
    app: App, workers: StartWorker
) -> None:
    started = threading.Event()
    release = threading.Event()
    finished = threading.Event()
    late: list[str] = []

    @app.task
    def deaf_thread(ctx: tether.SyncJobContext) -> None:
        ctx.save_checkpoint({"step": 1})
        started.set()
        release.wait(30)  # never looks at ctx.cancelled
        writes: list[Callable[[], None]] = [
            lambda: ctx.save_checkpoint({"step": 2}),
            lambda: ctx.save_artifact("late.txt", b"too late"),
        ]
        for write in writes:
            try:
                write()
                late.append("landed")
            except tether.LeaseLostError:
                late.append("refused")
        finished.set()

    worker = await workers(cancel_timeout=0.3)
    job = await deaf_thread.enqueue()
    assert await asyncio.to_thread(started.wait, 10)
    try:
        result = await app.cancel(job.id, wait=10)
    finally:
        release.set()
    assert await asyncio.to_thread(finished.wait, 10)

    assert (result.status, result.success, result.outcome) == ("partial", False, "cancelled")
    assert (result.job.state, result.job.stopped_by) == (JobState.CANCELLED, "abandoned")
    assert_one_runner(result, worker, "abandoned")
    assert len(result.errors) == 1 and "abandoned" in result.errors[0]
    record = await app.cancellations.get(job.id)
    assert record is not None and record.status == "partial"
    assert record.error is not None and "abandoned" in record.error
    ok, errors = await app.cancellations.wait(job.id, timeout=5)
    assert ok is False and errors == result.errors

    assert late == ["refused", "refused"]
    after = await app.get(job.id)
    assert (after.state, after.checkpoint) == (JobState.CANCELLED, {"step": 1})
    assert await app.jobs.artifacts(job.id) == []


# -- wait_cancelled ----------------------------------------------------------------------


async def test_wait_cancelled_is_woken_when_the_cancellation_settles(db_url: str) -> None:
    # Polling every 20 s: returning well within 10 s takes a notification.
    app = App(db_url, config=AppConfig(wait_poll_interval=20.0))
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task
    async def slow_to_stop(ctx: tether.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        await release.wait()
        ctx.check_cancelled()

    worker = Worker(app, fast_config(cancel_grace=30.0))
    await worker.start()
    try:
        job = await slow_to_stop.enqueue()
        await asyncio.wait_for(started.wait(), 10)
        cancelling = asyncio.create_task(app.cancel(job.id, wait=25))
        await eventually(lambda: _record_in(app, job.id, "stopping_runners"))
        waiter = asyncio.create_task(app.cancellations.wait(job.id, timeout=30))
        done, _ = await asyncio.wait({waiter}, timeout=0.3)
        assert not done
        release.set()
        assert await asyncio.wait_for(waiter, 10) == (True, [])
        record = await app.cancellations.get(job.id)
        assert record is not None and record.settled and record.status == "completed"
        await asyncio.wait_for(cancelling, 10)
        # Once settled, it is answered at once.
        assert await asyncio.wait_for(app.cancellations.wait(job.id, timeout=30), 5) == (True, [])
    finally:
        await worker.stop()
        await app.close()


async def test_wait_cancelled_for_a_job_never_cancelled_returns_false_after_its_timeout(
    app: App,
) -> None:
    @app.task
    async def idle(ctx: tether.JobContext) -> None:
        return None

    job = await idle.enqueue()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    ok, errors = await app.cancellations.wait(job.id, timeout=0.3)
    assert loop.time() - t0 >= 0.3
    assert (ok, errors) == (False, [f"job {job.id} has no cancellation"])
    assert (await app.get(job.id)).state is JobState.QUEUED


async def test_wait_cancelled_in_another_app_is_woken_by_notify(pg_url: str) -> None:
    app = App(pg_url, config=AppConfig(wait_poll_interval=0.05))
    observer = App(pg_url, config=AppConfig(wait_poll_interval=20.0))  # a CLI, say
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task
    async def slow_to_stop(ctx: tether.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()
        await release.wait()
        ctx.check_cancelled()

    worker = Worker(app, fast_config(cancel_grace=30.0))
    await worker.start()
    try:
        job = await slow_to_stop.enqueue()
        await asyncio.wait_for(started.wait(), 10)
        cancelling = asyncio.create_task(app.cancel(job.id, wait=25))
        await eventually(lambda: _record_in(observer, job.id, "stopping_runners"))
        waiter = asyncio.create_task(observer.cancellations.wait(job.id, timeout=30))
        done, _ = await asyncio.wait({waiter}, timeout=0.5)
        assert not done
        release.set()
        await asyncio.wait_for(cancelling, 10)
        try:
            assert await asyncio.wait_for(waiter, 3) == (True, [])
        except TimeoutError:
            pytest.fail("wait_cancelled was not woken by the NOTIFY of the settled record")
    finally:
        await worker.stop()
        await app.close()
        await observer.close()


# -- pause and resume --------------------------------------------------------------------


async def test_pausing_a_queued_job_pauses_it_at_once_and_resume_runs_it(
    app: App, workers: StartWorker
) -> None:
    @app.task
    async def later(ctx: tether.JobContext) -> str:
        return "ran"

    worker = await workers(services=False)
    job = await later.enqueue()
    paused = await app.jobs.pause(job.id, reason="hold on")
    assert (paused.state, paused.display_state, paused.pause_reason) == (
        JobState.PAUSED,
        "paused",
        "hold on",
    )
    assert await worker.claimer.run_once() == 0
    resumed = await app.jobs.resume(job.id)
    assert (resumed.state, resumed.pause_reason) == (JobState.QUEUED, None)
    assert await worker.claimer.run_once() == 1
    done = await app.wait(job.id, timeout=10)
    assert (done.state, done.result, done.attempt) == (JobState.SUCCEEDED, "ran", 1)


async def test_pausing_a_running_job_stops_it_at_a_checkpoint_and_resume_continues(
    app: App, workers: StartWorker
) -> None:
    halfway = asyncio.Event()
    reasons: list[str | None] = []
    runs: list[int] = []

    @app.task(max_attempts=1)
    async def long(ctx: tether.JobContext, n: int) -> int:
        start = (ctx.checkpoint or {}).get("next", 0)
        runs.append(start)
        for i in range(start, n):
            await ctx.save_checkpoint({"next": i + 1})
            if len(runs) == 1 and i == 2:
                halfway.set()
                await ctx.cancelled.wait()  # the first run waits here to be paused
            if ctx.cancelled:
                reasons.append(ctx.cancelled.reason)
                ctx.check_cancelled()
        return n

    await workers()
    job = await long.enqueue(n=5)
    await asyncio.wait_for(halfway.wait(), 10)
    pausing = await app.jobs.pause(job.id, reason="need the machine")
    assert (pausing.state, pausing.display_state) == (JobState.RUNNING, "pausing")
    paused = await eventually(lambda: _in_state(app, job.id, JobState.PAUSED))
    assert reasons == ["pause"]
    assert paused.checkpoint == {"next": 3}
    assert paused.attempt == 0, "a pause does not spend an attempt"
    assert paused.pause_reason == "need the machine"
    assert paused.stopped_by == "cooperative"

    resumed = await app.jobs.resume(job.id)
    assert resumed.state is JobState.QUEUED
    done = await app.wait(job.id, timeout=10)
    assert (done.state, done.result, done.attempt) == (JobState.SUCCEEDED, 5, 1)
    assert runs == [0, 3], "the second run starts from the checkpoint"
    path = [e.to_state for e in await app.jobs.events(job.id)]
    assert path == [
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.PAUSED,
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.SUCCEEDED,
    ]


async def test_pause_of_a_running_job_survives_a_graceful_worker_stop(app: App) -> None:
    started = asyncio.Event()

    @app.task
    async def busy(ctx: tether.JobContext) -> str:
        await ctx.save_checkpoint({"step": 1})
        started.set()
        await forever()
        return "unreachable"

    # No heartbeats: the pause request is not delivered before the worker stops.
    first = Worker(app, fast_config(stop_timeout=0.1))
    await first.start(services=False)
    job = await busy.enqueue()
    assert await first.claimer.run_once() == 1
    await asyncio.wait_for(started.wait(), 10)
    assert (await app.jobs.pause(job.id, reason="keep it")).display_state == "pausing"
    await first.stop()

    held = await app.get(job.id)
    assert (held.state, held.pause_reason, held.checkpoint) == (
        JobState.PAUSED,
        "keep it",
        {"step": 1},
    )
    assert held.attempt == 0
    second = Worker(app, fast_config())
    await second.start(services=False)
    try:
        assert await second.claimer.run_once() == 0
        assert (await app.get(job.id)).state is JobState.PAUSED
    finally:
        await second.stop()


async def test_pause_of_a_running_job_survives_its_worker_dying(app: App) -> None:
    started = asyncio.Event()

    @app.task
    async def busy(ctx: tether.JobContext) -> str:
        started.set()
        await forever()
        return "unreachable"

    doomed = Worker(app, fast_config(stop_timeout=0.1))
    await doomed.start(services=False)
    job = await busy.enqueue()
    assert await doomed.claimer.run_once() == 1
    await asyncio.wait_for(started.wait(), 10)
    await app.jobs.pause(job.id)
    store = await app.store()
    await store.set_worker_state(doomed.id, "dead")  # as the rescuer finds it

    heir = Worker(app, fast_config())
    await heir.start(services=False)  # may already rescue it while opening

    async def rescued() -> tether.Job | None:
        # PostgreSQL: once this process leads maintenance
        await heir.maintenance.rescuer.run_once()
        return await _in_state(app, job.id, JobState.PAUSED)

    try:
        await eventually(rescued)
        assert await heir.claimer.run_once() == 0
        await doomed.stop()  # its late outcome is fenced out
        after = await app.get(job.id)
        assert after.state is JobState.PAUSED
        assert (await app.jobs.events(job.id))[-1].reason == "rescued with a pending pause"
    finally:
        await heir.stop()
        await doomed.stop()


async def test_pausing_a_finished_job_is_refused_and_changes_nothing(
    app: App, workers: StartWorker
) -> None:
    @app.task(max_attempts=1)
    async def outcome(ctx: tether.JobContext, fail: bool) -> None:
        if fail:
            raise tether.Fail("no")

    await workers()
    ok = await app.wait((await outcome.enqueue(fail=False)).id, timeout=10)
    failed = await app.wait((await outcome.enqueue(fail=True)).id, timeout=10)
    # Delayed, so no worker takes it before it is cancelled.
    cancelled = (await app.cancel((await outcome.options(delay=3600).enqueue(fail=False)).id)).job
    assert [j.state for j in (ok, failed, cancelled)] == [
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
    ]
    for job in (ok, failed, cancelled):
        with pytest.raises(tether.IllegalTransitionError, match="cannot pause"):
            await app.jobs.pause(job.id)
        assert await app.get(job.id) == job


async def test_resuming_a_job_that_is_not_paused_is_refused_and_changes_nothing(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()

    @app.task
    async def work(ctx: tether.JobContext, hold: bool) -> None:
        if hold:
            started.set()
            await ctx.cancelled.wait()
            ctx.check_cancelled()

    worker = await workers(services=False)
    running = await work.enqueue(hold=True)
    assert await worker.claimer.run_once() == 1
    await asyncio.wait_for(started.wait(), 10)
    queued = await work.enqueue(hold=False)
    for job_id in (queued.id, running.id):
        before = await app.get(job_id)
        with pytest.raises(tether.IllegalTransitionError, match="cannot resume"):
            await app.jobs.resume(job_id)
        assert await app.get(job_id) == before
    await app.cancel(running.id, wait=0)
    await worker.heartbeater.run_once()  # delivers the cancel
    assert (await app.wait(running.id, timeout=10)).state is JobState.CANCELLED
    with pytest.raises(tether.JobNotFoundError):
        await app.jobs.resume(424242)


# -- queue pause -------------------------------------------------------------------------


async def test_paused_queue_makes_no_claims_while_running_jobs_finish(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()
    gate = asyncio.Event()

    @app.task
    async def job_(ctx: tether.JobContext, n: int) -> int:
        started.set()
        await gate.wait()
        return n

    worker = await workers(services=False)
    running = await job_.enqueue(n=1)
    assert await worker.claimer.run_once() == 1
    await asyncio.wait_for(started.wait(), 10)
    await app.queues.pause("default", reason="deploy")
    waiting = await job_.enqueue(n=2)
    assert await worker.claimer.run_once() == 0
    queues = {q.name: q for q in await app.queues.list()}
    assert (queues["default"].paused, queues["default"].reason) == (True, "deploy")

    gate.set()
    assert (await app.wait(running.id, timeout=10)).state is JobState.SUCCEEDED
    assert await worker.claimer.run_once() == 0
    assert (await app.get(waiting.id)).state is JobState.QUEUED

    await app.queues.resume("default")
    assert not {q.name: q for q in await app.queues.list()}["default"].paused
    assert await worker.claimer.run_once() == 1
    assert (await app.wait(waiting.id, timeout=10)).state is JobState.SUCCEEDED


# -- budgets -----------------------------------------------------------------------------


async def test_usage_over_budget_pauses_the_job_and_a_larger_budget_resumes_it(
    app: App, workers: StartWorker
) -> None:
    reasons: list[str | None] = []

    @app.task
    async def spender(ctx: tether.JobContext, steps: int) -> int:
        for i in range((ctx.checkpoint or {}).get("next", 0), steps):
            ctx.report_usage(4)
            await ctx.save_checkpoint({"next": i + 1})
            if ctx.cancelled:
                reasons.append(ctx.cancelled.reason)
                ctx.check_cancelled()
        return ctx.usage

    await workers()
    job = await app.enqueue(spender, {"steps": 5}, budget=10)
    assert job.budget == 10
    paused = await eventually(lambda: _in_state(app, job.id, JobState.PAUSED))
    assert reasons == ["pause"]
    assert paused.pause_reason is not None
    assert paused.pause_reason.startswith("budget exceeded"), paused.pause_reason
    assert paused.pause_reason == "budget exceeded: used 12 of 10"
    assert (paused.usage, paused.checkpoint, paused.attempt) == (12, {"next": 3}, 0)

    resumed = await app.jobs.resume(job.id, budget=100)
    assert (resumed.state, resumed.budget) == (JobState.QUEUED, 100)
    done = await app.wait(job.id, timeout=10)
    assert (done.state, done.result, done.usage) == (JobState.SUCCEEDED, 20, 20)


async def test_cancelling_a_job_paused_over_its_budget_fails_it(
    app: App, workers: StartWorker
) -> None:
    @app.task
    async def spender(ctx: tether.JobContext) -> None:
        ctx.report_usage(50)
        await ctx.cancelled.wait()
        ctx.check_cancelled()

    await workers()
    job = await spender.options(budget=10).enqueue()
    await eventually(lambda: _in_state(app, job.id, JobState.PAUSED))
    result = await app.cancel(job.id, reason="too expensive")
    assert (result.outcome, result.status, result.cancelled) == (
        "failed_over_budget",
        "completed",
        False,
    )
    assert result.tasks_failed == [job.id] and result.tasks_cancelled == []
    final = await app.get(job.id)
    assert (final.state, final.usage, final.budget) == (JobState.FAILED, 50, 10)
    last = (await app.jobs.events(job.id))[-1]
    assert (last.from_state, last.to_state, last.reason) == (
        JobState.PAUSED,
        JobState.FAILED,
        "too expensive",
    )


async def test_a_budget_that_is_not_positive_is_refused_at_enqueue_and_at_resume(
    app: App,
) -> None:
    @app.task
    async def priced(ctx: tether.JobContext) -> None:
        return None

    for budget in (0, -5):
        with pytest.raises(tether.InvalidJobError, match="budget must be positive"):
            await app.enqueue(priced, {}, budget=budget)
        with pytest.raises(tether.InvalidJobError, match="budget must be positive"):
            await priced.options(budget=budget).enqueue()
    assert sum((await app.jobs.stats()).values()) == 0

    job = await priced.options(budget=5).enqueue()
    paused = await app.jobs.pause(job.id)
    for budget in (0, -1):
        with pytest.raises(tether.InvalidJobError, match="budget must be positive"):
            await app.jobs.resume(job.id, budget=budget)
    assert await app.get(job.id) == paused


# -- artifacts ---------------------------------------------------------------------------


async def test_artifacts_are_kept_when_a_job_is_cancelled_and_listed_in_the_record(
    app: App, workers: StartWorker
) -> None:
    started = asyncio.Event()

    @app.task
    async def maker(ctx: tether.JobContext) -> None:
        await ctx.save_artifact("report.txt", b"page one")
        await ctx.save_artifact("data.bin", bytes(range(256)))
        await ctx.save_artifact("report.txt", b"page one and two")  # replaces
        started.set()
        await ctx.cancelled.wait()
        ctx.check_cancelled()

    await workers()
    job = await maker.enqueue()
    await asyncio.wait_for(started.wait(), 10)
    result = await app.cancel(job.id)
    assert result.outcome == "cancelled"
    assert artifact_names(result.artifacts_preserved) == ["data.bin", "report.txt"]
    listed = await app.jobs.artifacts(job.id)
    assert [(a.job_id, a.name, a.size) for a in listed] == [
        (job.id, "data.bin", 256),
        (job.id, "report.txt", 16),
    ]
    assert await app.jobs.artifact(job.id, "report.txt") == b"page one and two"
    assert await app.jobs.artifact(job.id, "data.bin") == bytes(range(256))
    with pytest.raises(LookupError, match="no artifact named"):
        await app.jobs.artifact(job.id, "missing")


async def test_artifacts_are_kept_when_a_job_fails(app: App, workers: StartWorker) -> None:
    @app.task(max_attempts=1)
    async def doomed(ctx: tether.JobContext) -> None:
        await ctx.save_artifact("trace.log", b"what went wrong")
        raise RuntimeError("broke")

    await workers()
    job = await app.wait((await doomed.enqueue()).id, timeout=10)
    assert job.state is JobState.FAILED
    assert [a.name for a in await app.jobs.artifacts(job.id)] == ["trace.log"]
    assert await app.jobs.artifact(job.id, "trace.log") == b"what went wrong"


async def test_oversized_artifact_is_refused_and_not_stored(db_url: str) -> None:
    app = App(db_url, config=AppConfig(wait_poll_interval=0.05, max_artifact_bytes=16))
    refused: list[BaseException] = []

    @app.task
    async def maker(ctx: tether.JobContext) -> None:
        try:
            await ctx.save_artifact("big", b"x" * 17)
        except tether.PayloadTooLargeError as exc:
            refused.append(exc)
        await ctx.save_artifact("small", b"x" * 16)

    worker = Worker(app, fast_config())
    await worker.start()
    try:
        job = await app.wait((await maker.enqueue()).id, timeout=10)
    finally:
        await worker.stop()
    try:
        assert job.state is JobState.SUCCEEDED
        assert len(refused) == 1 and "exceeds 16 bytes" in str(refused[0])
        assert [(a.name, a.size) for a in await app.jobs.artifacts(job.id)] == [("small", 16)]
    finally:
        await app.close()
