"""Hooks that fail: every worker runs hooks that raise (before or after calling on) or
stall, while poison jobs SIGKILL workers in the middle of them.

No job is lost, none runs twice beyond a crash's rerun, every normal job succeeds and
each poison job fails after exactly its attempts: a hook's failure never changes a
job's outcome, and a stalled outcome hook holds nothing up.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import pytest

from tests.faults.conftest import MakeScenario
from tests.faults.harness import read_exec_log, wait_all_done

pytestmark = pytest.mark.slow


async def _run(scenario: MakeScenario, name: str, store: str) -> None:
    s = await scenario(name, store=store, concurrency=4, claim_batch=2)
    p = s.params
    s.cluster.config["hooks"] = {"fail": p["fail"], "stall_s": 5.0}
    rng = random.Random(26)
    for worker in ("w0", "w1", "w2"):
        s.cluster.start(worker)
    s.supervise()
    normal: list[int] = []
    poison: list[int] = []
    per_batch = max(1, p["normal"] // p["poison"])
    for _ in range(p["poison"]):
        normal += await s.enqueue("work", [{"ms": rng.randint(20, 120)} for _ in range(per_batch)])
        poison += await s.enqueue("poison", [{}])
        await asyncio.sleep(0.2)
    t0 = time.monotonic()
    await wait_all_done(s.db, 90 + 3 * p["poison"])
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
    execs = read_exec_log(s.run_dir)
    failures = Counter((e["phase"], e["how"]) for e in execs if e["ev"] == "hook")
    # The hooks did fail, in both phases a worker runs them in, and did stall.
    assert failures[("execute", "before")] and failures[("execute", "after")], failures
    assert failures[("outcome", "before")] and failures[("outcome", "after")], failures
    s.figures = {
        "normal": len(normal),
        "poison": len(poison),
        "crashes": s.cluster.restarts,
        "hook_failures": sum(failures.values()),
        **{f"hook_{phase}_{how}": n for (phase, how), n in sorted(failures.items())},
        "normal_succeeded": sum(1 for j in normal if jobs[j][0] == "succeeded"),
        "normal_reruns": verdict.figures["reruns"],
        "drain_s": elapsed,
    }


async def test_flaky_hooks(scenario: MakeScenario) -> None:
    await _run(scenario, "hooks", "postgres")


async def test_sqlite_flaky_hooks(scenario: MakeScenario) -> None:
    await _run(scenario, "sqlite_hooks", "sqlite")
