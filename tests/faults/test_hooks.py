"""Hooks that fail: every worker runs hooks that raise (before or after calling on) or
stall, while poison jobs SIGKILL workers in the middle of them.

No job is lost, none runs twice beyond a crash's rerun, every normal job succeeds and
each poison job fails after exactly its attempts: a hook's failure never changes a
job's outcome, and a stalled outcome hook holds nothing up.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.faults.conftest import MakeScenario
from tests.faults.harness import read_exec_log
from tests.faults.test_jobs import run_poison

pytestmark = pytest.mark.slow


async def _run(scenario: MakeScenario, name: str, store: str) -> None:
    s = await scenario(name, store=store, concurrency=4, claim_batch=2)
    s.cluster.config["hooks"] = {"fail": s.params["fail"], "stall_s": 5.0}
    run = await run_poison(s, seed=26)
    failures = Counter(
        (e["phase"], e["how"]) for e in read_exec_log(s.run_dir) if e["ev"] == "hook"
    )
    # The hooks did fail, in both phases a worker runs them in, and did stall.
    assert failures[("execute", "before")] and failures[("execute", "after")], failures
    assert failures[("outcome", "before")] and failures[("outcome", "after")], failures
    s.figures = {
        "normal": len(run.normal),
        "poison": len(run.poison),
        "crashes": s.cluster.restarts,
        "hook_failures": sum(failures.values()),
        **{f"hook_{phase}_{how}": n for (phase, how), n in sorted(failures.items())},
        "normal_succeeded": sum(1 for j in run.normal if run.jobs[j][0] == "succeeded"),
        "normal_reruns": run.verdict.figures["reruns"],
        "drain_s": run.elapsed,
    }


async def test_flaky_hooks(scenario: MakeScenario) -> None:
    await _run(scenario, "hooks", "postgres")


async def test_sqlite_flaky_hooks(scenario: MakeScenario) -> None:
    await _run(scenario, "sqlite_hooks", "sqlite")
