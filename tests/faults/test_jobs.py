"""Scenarios 8 and 9: jobs that are themselves the fault.

8. Poison pill: jobs that kill their worker process on every attempt, mixed into normal
   jobs. Each is failed after exactly ``max_attempts`` (a crash counts); the normal jobs
   all succeed.
9. Hung job: handlers that never look at cancellation (a CPU loop in a process, a
   blocking call in a thread) are stopped by their timeout or a force cancel, as their
   executor allows, and their slots are freed. The abandoned thread's late effect is
   refused by the fence.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import pytest

from tests.faults.checker import Verdict
from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.harness import read_exec_log, wait_all_done, wait_for

pytestmark = pytest.mark.slow


@dataclass
class PoisonRun:
    """What a poison-pill run left: the jobs, their final rows and the checker's verdict."""

    normal: list[int]
    poison: list[int]
    jobs: dict[int, tuple[str, int, int]]
    verdict: Verdict
    elapsed: float


async def run_poison(s: Scenario, seed: int = 8) -> PoisonRun:
    """Poison jobs mixed into normal ones on three supervised workers, until all are
    done; checks the invariants (every normal job succeeds) and that each poison job
    failed after exactly its attempts."""
    p = s.params
    rng = random.Random(seed)
    for name in ("w0", "w1", "w2"):
        s.cluster.start(name)
    s.supervise()
    normal: list[int] = []
    poison: list[int] = []
    per_batch = max(1, p["normal"] // p["poison"])
    for _ in range(p["poison"]):
        normal += await s.enqueue("work", [{"ms": rng.randint(20, 120)} for _ in range(per_batch)])
        poison += await s.enqueue("poison", [{}])
        await asyncio.sleep(0.2)
    if len(normal) < p["normal"]:
        normal += await s.enqueue("work", [{"ms": 50}] * (p["normal"] - len(normal)))
    t0 = time.monotonic()
    await wait_all_done(s.db, 60 + 3 * p["poison"])
    elapsed = time.monotonic() - t0
    await s.unsupervise()
    codes = await s.cluster.stop_all()
    assert all(c == 0 for c in codes.values()), codes
    verdict = s.assert_invariants(must_succeed=set(normal))
    jobs = {
        int(r[0]): (r[1], int(r[2]), int(r[3]))
        for r in s.db.query("SELECT id, state, attempt, max_attempts FROM tether_jobs")
    }
    for job in poison:
        state, attempt, max_attempts = jobs[job]
        assert (state, attempt) == ("failed", max_attempts), (job, jobs[job])
    return PoisonRun(normal, poison, jobs, verdict, elapsed)


async def test_poison_pill(scenario: MakeScenario) -> None:
    s = await scenario("poison", concurrency=4, claim_batch=2)
    run = await run_poison(s)
    execs = read_exec_log(s.run_dir)
    starts = {j: sum(1 for e in execs if e["ev"] == "start" and e["job"] == j) for j in run.poison}
    for job in run.poison:
        assert starts[job] <= run.jobs[job][2]
    s.figures = {
        "poison": len(run.poison),
        "normal": len(run.normal),
        "crashes": s.cluster.restarts,
        "poison_attempts": sum(run.jobs[j][1] for j in run.poison),
        "poison_executions": sum(starts.values()),
        "normal_succeeded": sum(1 for j in run.normal if run.jobs[j][0] == "succeeded"),
        "normal_reruns": run.verdict.figures["reruns"],
        "drain_s": run.elapsed,
    }


async def test_hung_job(scenario: MakeScenario) -> None:
    s = await scenario("hung", concurrency=2, claim_batch=1)
    p = s.params
    s.cluster.start("w0")
    timeout = 1.0
    spin = await s.enqueue("spin", [{"seconds": 60}] * p["spin"], timeout=timeout)
    block = await s.enqueue("block", [{"seconds": 3}] * p["block"], timeout=timeout)
    force = await s.enqueue("spin", [{"seconds": 60}] * p["force"])
    normal = await s.enqueue("work", [{"ms": 50}] * p["normal"])
    cancels = []
    for job in force:
        await wait_for(lambda job=job: s.db.states([job]).get(job) == "running", 60)
        await asyncio.sleep(0.3)
        t = time.monotonic()
        res = await s.app.cancel(job, force=True, reason="hung", wait=15)
        cancels.append(time.monotonic() - t)
        assert res.outcome == "cancelled", res
    await wait_all_done(s.db, 60)
    # The abandoned threads wake up later and try their effect: it must be refused.
    await wait_for(
        lambda: (
            sum(1 for e in read_exec_log(s.run_dir) if e["ev"] == "effect" and e["job"] in block)
            == len(block)
        ),
        30,
    )
    codes = await s.cluster.stop_all()
    assert all(c == 0 for c in codes.values()), codes
    verdict = s.assert_invariants(must_succeed=set(normal))
    held = {}
    for job in spin + block + force:
        j = await s.app.get(job)
        assert j.started_at is not None and j.finished_at is not None
        held[job] = (j.finished_at - j.started_at).total_seconds()
        if job in force:
            assert j.state.value == "cancelled", j
        else:
            assert j.state.value == "failed" and "timed out" in (j.error or ""), (j.state, j.error)
    late = [e for e in read_exec_log(s.run_dir) if e["ev"] == "effect" and e["job"] in block]
    assert not any(e["ok"] for e in late), late
    s.figures = {
        "spin_timeouts": len(spin),
        "thread_timeouts": len(block),
        "force_cancels": len(force),
        "normal": len(normal),
        "timeout_s": timeout,
        "spin_slot_held_max": max(held[j] for j in spin),
        "thread_slot_held_max": max(held[j] for j in block),
        "force_cancel_s_max": max(cancels),
        "late_effects_refused": len(late),
        "stale_rejected": verdict.figures["stale_rejected"],
    }
    # How soon each hung job gave its slot back is a figure of the report
    # (conftest.TARGETS); that it did is asserted above (every job ended).
