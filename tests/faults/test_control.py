"""Scenarios 10 and 11 (and 12c on SQLite): control requests racing the work.

10. Cancel racing completion: every job is cancelled at a random moment near its end.
    Each job has one terminal state, the API's answer agrees with it, and no job is both
    cancelled and completed.
11. Pause under load: a queue is paused during a run. No job starts after the pause is
    acknowledged, the pause survives a SIGKILL of every worker, and claims resume
    quickly after resume.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from typing import Any

import pytest

from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.harness import percentiles, wait_all_done
from tether import IllegalTransitionError

pytestmark = pytest.mark.slow

# The state each answer of app.cancel() promises.
PROMISES = {
    "cancelled": "cancelled",
    "already_cancelled": "cancelled",
    "requested": "cancelled",
    "finished_first": "succeeded",
    "illegal": "succeeded",  # IllegalTransitionError: it had already succeeded
}


def _running_since(s: Scenario) -> list[tuple[int, float]]:
    started = "started_at" if s.sqlite else "extract(epoch FROM started_at)"
    rows = s.db.query(f"SELECT id, {started} FROM tether_jobs WHERE state = 'running'")
    return [(int(r[0]), float(r[1])) for r in rows]


async def cancel_race(s: Scenario, workers: int, seed: int) -> None:
    n = s.params["jobs"]
    rng = random.Random(seed)
    for i in range(workers):
        s.cluster.start(f"w{i}")
    durations: dict[int, int] = {}
    answers: dict[int, str] = {}
    lags: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def cancel_at(job: int, when: float) -> None:
        await asyncio.sleep(max(0.0, when - time.time()))
        lags.append(time.time() - when)
        try:
            res = await s.app.cancel(job, reason="race", wait=15)
            answers[job] = res.outcome
        except IllegalTransitionError:
            answers[job] = "illegal"
        s.history.add("cancel", job=job, answer=answers[job])

    async def produce() -> None:
        left = n
        while left > 0:
            size = min(8, left)
            ms = [rng.randint(150, 400) for _ in range(size)]
            ids = await s.enqueue("work", [{"ms": m} for m in ms])
            durations.update(zip(ids, ms, strict=True))
            left -= size
            await asyncio.sleep(0.25)

    producer = asyncio.create_task(produce())
    seen: set[int] = set()
    deadline = time.monotonic() + 60 + n * 0.1
    while time.monotonic() < deadline:
        for job, started in _running_since(s):
            if job in seen or job not in durations:
                continue
            seen.add(job)
            # Near its end: the request leaves 0 to 300 ms before the job would finish
            # and takes some tens of milliseconds to arrive.
            when = started + durations[job] / 1000 + rng.uniform(-0.3, 0.0)
            task = asyncio.create_task(cancel_at(job, when))
            tasks.add(task)
        if producer.done() and len(answers) == len(seen) and all(t.done() for t in tasks):
            counts = s.db.counts()
            if not any(counts.get(st) for st in ("queued", "running", "retrying")):
                break
        await asyncio.sleep(0.02)
    await producer
    await asyncio.gather(*tasks)
    await wait_all_done(s.db, 30)
    codes = await s.cluster.stop_all()
    assert all(c == 0 for c in codes.values()), codes
    verdict = s.assert_invariants()
    states = s.db.states(list(durations))
    effects = {int(r[0]) for r in s.db.query("SELECT job_id FROM fault_effects")}
    disagree: list[Any] = [
        (job, answer, states[job])
        for job, answer in answers.items()
        if PROMISES.get(answer) != states[job]
    ]
    by_answer: dict[str, int] = {}
    for answer in answers.values():
        by_answer[answer] = by_answer.get(answer, 0) + 1
    lag = percentiles(lags)
    s.figures = {
        "jobs": len(durations),
        "cancels": len(answers),
        **{f"answer_{k}": v for k, v in sorted(by_answer.items())},
        "succeeded": verdict.figures["succeeded"],
        "cancelled": verdict.figures["cancelled"],
        "cancelled_after_effect": sum(
            1 for j, st in states.items() if st == "cancelled" and j in effects
        ),
        "disagreements": len(disagree),
        "cancel_lag_p99": lag["p99"],
    }
    assert set(states.values()) <= {"succeeded", "cancelled"}, s.figures
    assert not disagree, disagree[:10]
    assert len(answers) >= 0.9 * n, s.figures  # nearly every job got its racing cancel


async def test_cancel_racing_completion(scenario: MakeScenario) -> None:
    s = await scenario("cancel_race")
    await cancel_race(s, workers=3, seed=10)


async def test_sqlite_cancel_racing_completion(scenario: MakeScenario) -> None:
    s = await scenario("sqlite_cancel_race", store="sqlite")
    await cancel_race(s, workers=4, seed=12)


async def test_pause_under_load(scenario: MakeScenario) -> None:
    s = await scenario("pause")
    n = s.params["jobs"]
    rng = random.Random(11)
    names = ["w0", "w1", "w2"]
    for name in names:
        s.cluster.start(name)
    s.supervise()

    async def produce() -> None:
        left = n
        while left > 0:
            size = min(max(1, n // 20), left)
            await s.enqueue("work", [{"ms": rng.randint(100, 300)} for _ in range(size)])
            left -= size
            await asyncio.sleep(0.1)

    producer = asyncio.create_task(produce())
    await asyncio.sleep(1.0)
    await s.app.queues.pause("default", reason="fault test")
    t_ack = time.time()
    s.history.add("pause_queue")
    await asyncio.sleep(1.0)
    for name in s.cluster.alive():
        pid = s.cluster.pid(name)
        s.history.add("kill", name=name, pid=pid, held=s.db.running_of(pid))
        s.cluster.signal(name, signal.SIGKILL)
    await producer
    # The supervisor restarts every worker; the rescuer frees the killed jobs; nothing
    # may be claimed while the queue stays paused.
    await asyncio.sleep(4.0)
    queued_while_paused = s.db.counts()
    t_resume = time.time()
    await s.app.queues.resume("default")
    s.history.add("resume_queue")
    await wait_all_done(s.db, 60)
    await s.unsupervise()
    codes = await s.cluster.stop_all()
    assert all(c == 0 for c in codes.values()), codes
    verdict = s.assert_invariants(must_succeed=s.history.acked())
    claims = [e for e in s.db.events() if e["dst"] == "running"]
    during = [e for e in claims if t_ack < e["at"] < t_resume]
    after = sorted(e["at"] for e in claims if e["at"] >= t_resume)
    s.figures = {
        "jobs": verdict.figures["jobs"],
        "workers_killed": len(names),
        "restarts": s.cluster.restarts,
        "waiting_when_resumed": queued_while_paused.get("queued", 0)
        + queued_while_paused.get("retrying", 0),
        "claims_while_paused": len(during),
        "first_claim_after_resume_s": (after[0] - t_resume) if after else None,
        "reruns": verdict.figures["reruns"],
    }
    assert not during, during[:5]
    assert after, s.figures  # claimed again once resumed (how soon: conftest.TARGETS)
