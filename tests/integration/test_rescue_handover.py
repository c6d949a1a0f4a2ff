"""Every worker watches the beat counters, so a worker that takes over the maintenance
lead from a frozen leader rescues at once, with the history it gathered meanwhile."""

from __future__ import annotations

import os

from tests.conformance.support import Db
from tests.integration.control_support import StartWorker
from tether import App, JobState
from tether.job import Beat


async def test_a_worker_taking_over_from_a_frozen_leader_rescues_at_once(
    app: App, db_url: str, workers: StartWorker
) -> None:
    @app.task
    async def work(ctx: object) -> None: ...

    now = [0.0]
    leader = await workers(services=False)
    heir = await workers(services=False)
    heir.maintenance.rescuer.clock = lambda: now[0]
    store = await app.store()

    # A worker of another host that beat once and then fell silent (its process cannot
    # be checked from here, and it keeps its database session: only silence tells).
    await store.register_worker("silent", None, "elsewhere", os.getpid(), None, ["default"], 1)
    job = await work.enqueue()
    [claimed] = await store.claim("silent", ["default"], [work.name], 1, 60)
    assert claimed.id == job.id
    await store.heartbeat("silent", [Beat(job.id, claimed.lease_token)], 60)

    assert await leader.maintenance.leader.run_once()
    assert not await heir.maintenance.leader.run_once()
    await heir.maintenance.rescuer.round()  # not leading: it only watches
    now[0] = 61.0  # a lease and more by the heir's monotonic clock, no beat meanwhile
    await heir.maintenance.rescuer.round()
    assert (await app.get(job.id)).state is JobState.RUNNING

    # The leader freezes: its lease row runs out, the heir takes the lead and rescues
    # in its first round, without watching for another lease first.
    db = Db(db_url)
    try:
        db.expire_lease(job.id)
        hour = "3600" if db.dialect == "sqlite" else "interval '1 hour'"
        db.execute(f"UPDATE tether_leaders SET expires_at = expires_at - {hour}")
    finally:
        db.close()
    assert await heir.maintenance.leader.run_once()
    await heir.maintenance.rescuer.round()
    rescued = await app.get(job.id)
    assert rescued.state is JobState.RETRYING, rescued
