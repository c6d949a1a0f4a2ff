"""Cancel racing completion: exactly one terminal state, and it matches the answer."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import tether
from tests.helpers import fast_config
from tether import App, JobState, Worker


async def test_cancel_racing_completion_hundreds_of_times(app: App) -> None:
    rng = random.Random(7)

    @app.task(max_attempts=1)
    async def brief(ctx: tether.JobContext, ms: int) -> int:
        await asyncio.sleep(ms / 1000)
        return ms

    worker = Worker(app, fast_config(concurrency=20, cancel_grace=0.05))
    await worker.start()
    try:
        jobs = await app.enqueue_many([(brief, {"ms": rng.randint(0, 30)}) for _ in range(300)])

        async def cancel_soon(job_id: int) -> tuple[int, str]:
            await asyncio.sleep(rng.randint(0, 40) / 1000)
            try:
                return job_id, (await app.cancel(job_id, wait=10)).outcome
            except tether.IllegalTransitionError as exc:
                # Finished before the request: the refusal names the state it found.
                assert exc.state == "succeeded"
                return job_id, "refused"

        answers = await asyncio.gather(*(cancel_soon(j.id) for j in jobs))
    finally:
        await worker.stop()

    outcomes = Counter(outcome for _, outcome in answers)
    assert set(outcomes) <= {"cancelled", "finished_first", "refused"}
    assert outcomes["cancelled"] > 0 and outcomes["finished_first"] + outcomes["refused"] > 0
    for job_id, outcome in answers:
        final = await app.get(job_id)
        expected = JobState.CANCELLED if outcome == "cancelled" else JobState.SUCCEEDED
        assert final.state is expected, (outcome, final)
        terminal = [e for e in await app.jobs.events(final.id) if e.to_state.value in _TERMINAL]
        assert len(terminal) == 1, terminal
        if final.state is JobState.CANCELLED:
            assert final.result is None


_TERMINAL = {"succeeded", "failed", "cancelled"}
