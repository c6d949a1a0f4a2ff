"""Retention never changes a workflow's result: a failed parent that a person may still
retry keeps its finished children, so a retry after pruning fans in over all of them."""

from __future__ import annotations

from tests.conformance.support import Db
from tests.integration.conftest import StartWorker
from tether import App, JobContext, JobState
from tether.config import DAY, RetentionConfig
from tether.errors import Fail, WaitForChildren
from tether.maintenance import Pruner

CHILDREN = 60


async def test_a_retry_after_pruning_fans_in_over_every_child(
    app: App, workers: StartWorker
) -> None:
    failures = [True]  # the first fan-in fails, as a flaky downstream would

    @app.task
    async def one(ctx: JobContext, n: int) -> int:
        return 1

    @app.task(max_attempts=1)
    async def total(ctx: JobContext) -> int:
        if ctx.phase is None:
            for n in range(CHILDREN):
                await ctx.spawn(one, n=n)
            raise WaitForChildren(phase="sum")
        if failures.pop() if failures else False:
            raise Fail("the fan-in failed")
        kids = await ctx.children()
        return sum(k.result for k in kids if k.state is JobState.SUCCEEDED)

    await workers(concurrency=8)
    parent = await total.enqueue()
    failed = await app.wait(parent.id, timeout=30)
    assert failed.state is JobState.FAILED, failed.error
    kids = await app.jobs.children(parent.id)
    assert len(kids) == CHILDREN and {k.state for k in kids} == {JobState.SUCCEEDED}

    # Two days on: the children are past succeeded's retention (1 day); the parent,
    # failed a day ago, is well within failed's (7 days), so a person may retry it.
    db = Db(app.url)
    try:
        for kid in kids:
            db.set_ago("tether_jobs", "finished_at", kid.id, 2 * DAY)
        db.set_ago("tether_jobs", "finished_at", parent.id, 1 * DAY)
    finally:
        db.close()
    report = await Pruner(await app.store(), RetentionConfig(batch_pause=0)).prune()
    assert report.counts.get("jobs", 0) == 0
    assert len(await app.jobs.children(parent.id)) == CHILDREN

    await app.jobs.retry(parent.id)
    done = await app.wait(parent.id, timeout=30)
    assert (done.state, done.result) == (JobState.SUCCEEDED, CHILDREN)
