"""The checker itself: invariant 7 must see a rescue of a live worker even when every
job ends ``succeeded``, and must not cry wolf over a dead one's."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

from tests.conformance.support import enqueue_one
from tests.faults import effects
from tests.faults.checker import check
from tests.faults.harness import Db, History
from tether.job import Job, Outcome
from tether.procinfo import WorkerProcess
from tether.states import JobState
from tether.store import Store


def log(run_dir: Path, proc: str, **fields: object) -> None:
    """One line of ``proc``'s execution log, as ``faultapp.record`` writes it."""
    with (run_dir / "exec" / f"exec-{proc}.log").open("a") as f:
        f.write(json.dumps({**fields, "pid": 1, "proc": proc, "t": time.time()}) + "\n")


async def claim(store: Store, run_dir: Path, proc: str) -> Job:
    """Worker ``proc`` (registered under its own id) claims the job and starts it."""
    [job] = await store.claim(f"vm:1:{proc}", ["default"], ["t"], 1, 60.0)
    log(run_dir, proc, ev="start", job=job.id, attempt=job.attempt, token=job.lease_token)
    return job


async def rescue_then_succeed(
    store: Store, url: str, tmp_path: Path, history: History, *, first_died: bool
) -> Path:
    """Worker A runs the job; it is rescued as a dead worker's; B runs it to success.

    With ``first_died``, A was SIGKILLed before the rescue; otherwise A was alive and its
    attempt went on after the rescue: the defect invariant 7 exists to catch.
    """
    (tmp_path / "exec").mkdir()
    db = Db(url)
    db.execute_script(effects.SQLITE_SCHEMA if db.sqlite else effects.PG_SCHEMA)
    for proc in ("a#1", "b#1"):
        (tmp_path / "exec" / f"worker-{proc}.id").write_text(f"vm:1:{proc}")
        await store.register_worker(f"vm:1:{proc}", None, "vm", 1, None, ["default"], 1)
    job = await enqueue_one(store)
    history.add("enqueued", task="t", ids=[job.id])
    first = await claim(store, tmp_path, "a#1")
    if first_died:
        history.add("signal", name="a", pid=1, sig=signal.SIGKILL.name, proc="a#1")

    def only_a(proc: WorkerProcess) -> bool:  # the judgement under test: "A is gone"
        return proc.pid == 1 and proc.pid_start is None

    await store.set_worker_state("vm:1:b#1", "stopped")  # only A is judged
    assert await store.mark_dead_workers(only_a, 3600) == ["vm:1:a#1"]
    await store.set_worker_state("vm:1:b#1", "active")
    assert [j.id for j in await store.rescue()] == [first.id]
    second = await claim(store, tmp_path, "b#1")
    log(tmp_path, "b#1", ev="end", job=second.id, token=second.lease_token, how="returned")
    done = Outcome(second.id, second.lease_token, JobState.SUCCEEDED, result_json="1")
    assert await store.finish("vm:1:b#1", [done]) == {second.id}
    if not first_died:
        await asyncio.sleep(0.01)  # A went on for a while after the rescue
        log(tmp_path, "a#1", ev="end", job=first.id, token=first.lease_token, how="fenced")
    return tmp_path


async def test_rescue_of_a_live_worker_fails_the_check_though_the_job_succeeded(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    history = History(tmp_path / "history.jsonl")
    run_dir = await rescue_then_succeed(store, db_url, tmp_path, history, first_died=False)
    verdict = check(Db(db_url), run_dir, history, must_succeed=history.acked())
    assert verdict.figures["succeeded"] == 1
    assert (verdict.figures["overlaps"], verdict.figures["live_rescues"]) == (1, 1)
    assert all(v.startswith("inv7") for v in verdict.violations), verdict.violations


async def test_rescue_of_a_killed_worker_passes_the_check(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    history = History(tmp_path / "history.jsonl")
    run_dir = await rescue_then_succeed(store, db_url, tmp_path, history, first_died=True)
    verdict = check(Db(db_url), run_dir, history, must_succeed=history.acked())
    assert verdict.violations == []
    assert (verdict.figures["overlaps"], verdict.figures["live_rescues"]) == (0, 0)


def test_a_bucket_overrun_is_seen_and_a_paced_drain_is_not() -> None:
    from tests.faults.checker import rate_overruns

    paced = [i / 5 for i in range(30)]  # 5/s exactly
    assert rate_overruns(paced, 5.0, 5) == []
    burst_then_paced = [0.0] * 5 + [1 + i / 5 for i in range(10)]
    assert rate_overruns(burst_then_paced, 5.0, 5) == []
    twice = [0.0] * 5 + [0.005] * 5  # ten within 5 ms under 5/s, burst 5
    assert max(count for count, _ in rate_overruns(twice, 5.0, 5)) == 10


def test_missing_ticks_names_the_gap() -> None:
    from tests.faults.checker import missing_ticks

    ticks = [100.0, 101.0, 102.0, 105.0, 106.0]
    assert missing_ticks(ticks, 100.0, 106.0) == [103.0, 104.0]
    assert missing_ticks(ticks, 100.0, 102.5) == []


def _run_dir(db_url: str, tmp_path: Path) -> tuple[Db, History]:
    """A scenario's run directory and fault schema, as the harness makes them."""
    (tmp_path / "exec").mkdir()
    db = Db(db_url)
    db.execute_script(effects.SQLITE_SCHEMA if db.sqlite else effects.PG_SCHEMA)
    return db, History(tmp_path / "history.jsonl")


async def run_to_success(store: Store, run_dir: Path, proc: str, *, at: float) -> Job:
    """``proc`` claims the next job and succeeds with it; its attempt is logged as having
    run just before ``at``."""
    [job] = await store.claim(f"vm:1:{proc}", ["default"], ["t"], 1, 60.0)
    for ev, t in (("start", at - 0.2), ("end", at)):
        row = {"ev": ev, "job": job.id, "attempt": job.attempt, "token": job.lease_token}
        with (run_dir / "exec" / f"exec-{proc}.log").open("a") as f:
            f.write(json.dumps({**row, "pid": 1, "proc": proc, "t": t, "how": "returned"}) + "\n")
    done = Outcome(job.id, job.lease_token, JobState.SUCCEEDED, result_json="1")
    assert await store.finish(f"vm:1:{proc}", [done]) == {job.id}
    return job


async def test_a_dependent_started_before_its_dependency_ended_fails_the_check(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    db, history = _run_dir(db_url, tmp_path)
    first = await enqueue_one(store)
    second = await enqueue_one(store, depends_on=(first.id,))
    history.add("enqueued", task="t", ids=[first.id, second.id])
    now = time.time()
    await run_to_success(store, tmp_path, "a#1", at=now)
    in_order = check(db, tmp_path, history)
    assert in_order.figures["out_of_order"] == 0
    # The dependent's attempt is logged as having started before the dependency ended.
    await run_to_success(store, tmp_path, "a#1", at=now - 0.1)
    verdict = check(db, tmp_path, history)
    assert verdict.figures["out_of_order"] == 1
    assert [v for v in verdict.violations if v.startswith("inv9")], verdict.violations


async def test_a_dependent_left_blocked_after_its_dependencies_succeeded_fails_the_check(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    db, history = _run_dir(db_url, tmp_path)
    done = await enqueue_one(store)
    other = await enqueue_one(store, task="other")
    waiting = await enqueue_one(store, task="other", depends_on=(other.id,))
    await run_to_success(store, tmp_path, "a#1", at=time.time())
    # A lost wake-up, made by hand: the blocked job now waits only on the succeeded one.
    db.execute_script(
        f"UPDATE tether_dependencies SET depends_on = {done.id} WHERE job_id = {waiting.id}"
    )
    verdict = check(db, tmp_path, history)
    assert verdict.figures["stuck_dependents"] == 1
    assert any(v.startswith(f"inv8: job {waiting.id} is blocked") for v in verdict.violations)


async def test_a_rate_bucket_whose_clock_moves_back_fails_the_check(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    db, history = _run_dir(db_url, tmp_path)
    await store.set_rate_limit("task", "t", 5.0, 5)
    assert check(db, tmp_path, history).figures["bucket_steps_back"] == 0
    back = "refilled_at - 1" if db.sqlite else "refilled_at - interval '1 second'"
    db.execute_script(f"UPDATE tether_rate_limits SET refilled_at = {back}")
    verdict = check(db, tmp_path, history)
    assert verdict.figures["bucket_steps_back"] == 1
    assert [v for v in verdict.violations if v.startswith("inv10")], verdict.violations


async def test_a_history_told_twice_or_with_a_gap_fails_the_check(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    db, history = _run_dir(db_url, tmp_path)
    job = await enqueue_one(store)
    history.add("enqueued", task="t", ids=[job.id])
    await run_to_success(store, tmp_path, "a#1", at=time.time())
    assert not [v for v in check(db, tmp_path, history).violations if v.startswith("inv2")]
    # A claim stored by hand, beside the one stored or read off the row.
    now = "0" if db.sqlite else "now()"
    db.execute_script(
        "INSERT INTO tether_job_events (job_id, from_state, to_state, at, actor) "
        f"VALUES ({job.id}, 'queued', 'running', {now}, 'worker')"
    )
    verdict = check(db, tmp_path, history)
    assert any(v.startswith(f"inv2: job {job.id}'s history breaks") for v in verdict.violations)


async def test_a_step_whose_fenced_write_committed_twice_fails_the_check(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    db, history = _run_dir(db_url, tmp_path)
    job = await enqueue_one(store, task="durable")
    history.add("enqueued", task="durable", ids=[job.id])
    [run] = await store.claim("vm:1:a#1", ["default"], ["durable"], 1, 60.0)
    for ev in ("start", "step_start", "step_write"):
        log(
            tmp_path,
            "a#1",
            ev=ev,
            job=run.id,
            attempt=run.attempt,
            token=run.lease_token,
            step="s0",
        )
    # The step's record and its fenced write, committed together, as faultapp's do.
    assert await store.save_step(run.id, run.lease_token, "s0", "0")
    effect = (
        "INSERT INTO fault_step_effects (job_id, step, attempt, lease_token, pid, at) "
        f"VALUES ({run.id}, 's0', {{attempt}}, {{token}}, 1, 0)"
    )
    db.execute_script(effect.format(attempt=run.attempt, token=run.lease_token))
    log(
        tmp_path,
        "a#1",
        ev="step_done",
        job=run.id,
        attempt=run.attempt,
        token=run.lease_token,
        step="s0",
    )
    log(tmp_path, "a#1", ev="end", job=run.id, token=run.lease_token, how="returned")
    done = Outcome(run.id, run.lease_token, JobState.SUCCEEDED, result_json="[0]")
    assert await store.finish("vm:1:a#1", [done]) == {run.id}
    clean = check(db, tmp_path, history, must_succeed={run.id})
    assert clean.violations == []
    assert (clean.figures["steps"], clean.figures["step_effects"]) == (1, 1)

    # A second attempt's write of the same step got through (a zombie's, say), and its
    # function ran again though the step was recorded as done.
    db.execute_script(effect.format(attempt=run.attempt + 1, token=run.lease_token))
    log(
        tmp_path,
        "b#1",
        ev="step_start",
        job=run.id,
        attempt=run.attempt + 1,
        token=run.lease_token,
        step="s0",
    )
    verdict = check(db, tmp_path, history, must_succeed={run.id})
    assert verdict.figures["step_effects"] == 2
    assert any(
        v.startswith(f"inv12: job {run.id} step 's0': 2 fenced writes") for v in verdict.violations
    ), verdict.violations
    assert any(
        v.startswith(f"inv12: job {run.id} succeeded with 2 committed writes")
        for v in verdict.violations
    ), verdict.violations
    assert any(v.startswith(f"inv11: job {run.id} step 's0' ran again") for v in verdict.violations)
    assert all(v.startswith(("inv11", "inv12")) for v in verdict.violations), verdict.violations
