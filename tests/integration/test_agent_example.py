"""The agent example in examples/agent.py: its paid model calls run once per job, it
waits for approval holding no lease, and its usage counts against its budget; on both
stores, with a real worker, and as a script that runs as written."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from examples.agent import BUDGET, SimulatedModel, register

import tether
from tests.helpers import eventually
from tests.integration.control_support import StartWorker
from tether import App, JobState

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent.py"
PAID = ["plan", "research:0", "research:1"]


async def _waiting_for_approval(app: App, job_id: int) -> tether.Job:
    async def parked() -> tether.Job | None:
        steps = {s.name: s.state for s in await app.durable.steps(job_id)}
        job = await app.get(job_id)
        waiting = job.state is JobState.QUEUED and steps.get("signal:approval") == "waiting"
        return job if waiting else None

    return await eventually(parked, timeout=15)


async def test_the_agent_runs_each_paid_call_once_across_its_wait_for_approval(
    app: App, workers: StartWorker
) -> None:
    model = SimulatedModel()
    agent = register(app, model)
    job = await agent.options(budget=BUDGET).enqueue(goal="compare vendors")
    await workers()

    parked = await _waiting_for_approval(app, job.id)
    assert parked.lease_expires_at is None and parked.attempt == 0  # nothing held or spent
    assert len(model.calls) == 3
    steps = await app.durable.steps(job.id)
    assert [s.name for s in steps] == [*PAID, "signal:approval"]
    # The tokens reported before the wait are on the job as it waits.
    assert parked.usage == sum(s.usage for s in steps) > 0

    assert await app.durable.signal(job.id, "approval", {"approved": True, "by": "ana"}) == "woke"
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.attempt == 1
    assert done.result is not None and done.result["status"] == "done"
    assert done.result["approved_by"] == "ana"

    steps = await app.durable.steps(job.id)
    assert [(s.name, s.state) for s in steps] == [
        *[(name, "done") for name in PAID],
        ("signal:approval", "done"),
        ("write_report", "done"),
    ]
    paid = {s.name: s for s in steps if s.kind == "step"}
    # Each paid step ran once: the handler ran twice (before and after the wait), the
    # model was called once per step, and every step left its usage.
    assert len(model.calls) == len(paid) == 4
    assert all(s.usage > 0 for s in paid.values())
    assert paid["write_report"].usage > 5 * paid["plan"].usage  # the costly one
    assert done.usage == sum(s.usage for s in steps) <= BUDGET


class FlakyModel(SimulatedModel):
    """Fails the first costly call, as a model API's transient error would."""

    def complete(self, prompt: str, *, effort: int = 1) -> dict[str, Any]:
        if effort > 1 and not any(p == prompt for p in self.calls):
            self.calls.append(prompt)
            raise ConnectionError("the model API timed out")
        return super().complete(prompt, effort=effort)


async def test_a_retried_agent_does_not_pay_again_for_the_calls_it_finished(
    app: App, workers: StartWorker
) -> None:
    model = FlakyModel()
    agent = register(app, model)
    job = await agent.options(budget=BUDGET).enqueue(goal="compare vendors")
    # A signal sent before the wait is kept: the job does not park at all.
    assert await app.durable.signal(job.id, "approval", {"approved": True}) == "kept"
    await workers()
    done = await app.wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.attempt == 2
    # The first attempt's report call failed; the retry made only that call again.
    counts = Counter(model.calls)
    assert len(counts) == 4 and list(counts.values()) == [1, 1, 1, 2]
    steps = {s.name: s for s in await app.durable.steps(job.id)}
    assert [steps[name].attempt for name in PAID] == [1, 1, 1]
    assert steps["write_report"].attempt == 2
    assert done.usage == sum(s.usage for s in steps.values())


async def test_a_rejected_agent_never_makes_its_costly_call(app: App, workers: StartWorker) -> None:
    model = SimulatedModel()
    agent = register(app, model)
    job = await agent.enqueue(goal="compare vendors")
    await workers()
    await _waiting_for_approval(app, job.id)
    decision = {"approved": False, "by": "ana"}
    assert await app.durable.signal(job.id, "approval", decision) == "woke"
    done = await app.wait(job.id, timeout=20)
    assert done.result == {"status": "rejected", "by": "ana"}
    assert "write_report" not in {s.name for s in await app.durable.steps(job.id)}
    assert len(model.calls) == 3


def test_the_agent_script_runs_as_written(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TETHER_DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "job 1 queued: waiting for signal 'approval' (timeout 604800s)"
    assert lines[1].startswith("job 1 succeeded: {'status': 'done', 'approved_by': 'ana'")
    assert lines[-1] == f"model calls: 4, tokens used: 736 of {BUDGET}"
