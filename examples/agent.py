"""An agent whose model calls are durable steps, and which waits for a person's approval
before its costly step: ``python examples/agent.py``.

Each model call runs in ``ctx.step``: it runs once per job, its answer is stored, and
the tokens it reports with ``ctx.report_usage`` count against the job's budget. The
agent then waits for the signal ``approval`` (``ctx.wait_for``): the job gives back its
lease and its worker slot until someone sends it, here with
``app.durable.signal(job_id, "approval", {...})``. When it wakes, the handler runs again
from the top, gets the stored answers of the calls it already made without paying for
them again, and goes on to the costly step.

The model is simulated (deterministic, nothing leaves the machine). A worker runs in
this process (``app.run_until_idle()``); in production, run ``tether worker --app
agent:app`` and send the approval from the CLI, the REST API or the dashboard.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import tether

BUDGET = 5_000
"""Tokens one agent job may use; going over it pauses the job."""


@dataclass
class SimulatedModel:
    """A stand-in for a paid model API: a deterministic answer, and its token count."""

    calls: list[str] = field(default_factory=list)
    """The prompts it was called with, in order: what was paid for."""

    def complete(self, prompt: str, *, effort: int = 1) -> dict[str, Any]:
        """Answer ``prompt``; ``effort`` multiplies the tokens it costs."""
        self.calls.append(prompt)
        tokens = effort * (40 + 3 * len(prompt.split()))
        return {"text": f"answer #{len(self.calls)}: {prompt.lower()}", "tokens": tokens}


def register(app: tether.App, model: SimulatedModel) -> tether.Task:
    """The agent task, on ``app``, calling ``model``."""

    @app.task(name="agent", max_attempts=3)
    async def agent(ctx: tether.JobContext, goal: str) -> dict[str, Any]:
        async def call(prompt: str, effort: int = 1) -> str:
            answer = model.complete(prompt, effort=effort)
            ctx.report_usage(answer["tokens"])  # recorded with the step, and on the job
            return str(answer["text"])

        # Code outside steps runs again on every attempt and after every wake-up:
        # keep it cheap and free of side effects. Each paid call is a step.
        plan = await ctx.step("plan", call, f"Plan how to {goal}")
        findings = []
        for i, part in enumerate(["sources", "risks"]):  # a step name per iteration
            findings.append(await ctx.step(f"research:{i}", call, f"Research the {part}"))

        # Parked until a person decides: no lease, no worker slot, no attempt spent.
        try:
            decision = await ctx.wait_for("approval", timeout=7 * 24 * 3600)
        except tether.SignalTimeoutError:
            return {"status": "expired"}
        if not isinstance(decision, dict) or not decision.get("approved"):
            return {"status": "rejected", "by": _by(decision)}

        # The costly step, only after approval; once per job, whatever happens next.
        prompt = f"Write the report from {len(findings)} findings"
        report = await ctx.step("write_report", call, prompt, 10)
        return {"status": "done", "approved_by": _by(decision), "plan": plan, "report": report}

    return agent


def _by(decision: Any) -> Any:
    return decision.get("by") if isinstance(decision, dict) else None


app = tether.App()  # $TETHER_DATABASE_URL, else sqlite:///tether.db
model = SimulatedModel()
agent = register(app, model)


async def main() -> None:
    job = await agent.options(budget=BUDGET).enqueue(goal="compare three vendors")
    await app.run_until_idle()  # plans, researches, then waits for approval
    parked = await app.get(job.id)
    why = (await app.jobs.events(job.id))[-1].reason
    print(f"job {job.id} {parked.state.value}: {why}")

    await app.durable.signal(job.id, "approval", {"approved": True, "by": "ana"})
    [done] = await app.run_until_idle()  # replays the paid steps, then writes the report
    print(f"job {job.id} {done.state.value}: {done.result}")
    for step in await app.durable.steps(job.id):
        print(f"  {step.name:<15} {step.kind:<6} {step.state:<4} {step.usage:>4} tokens")
    print(f"model calls: {len(model.calls)}, tokens used: {done.usage} of {BUDGET}")
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
