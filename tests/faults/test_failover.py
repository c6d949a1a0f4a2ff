"""Scenario 15: PostgreSQL fails over to a synchronous standby under running work.

A private primary and a streaming standby with synchronous replication
(:mod:`tests.faults.replication`). Three workers, each on a host of its own
(:mod:`tests.faults.hosts`), and a producer in this process all use one multi-host URL
(``postgresql://p1,p2/db?target_session_attrs=read-write``), so libpq finds whichever
server accepts writes. While work flows, the primary is stopped ``-m immediate`` and,
a moment later, the standby is promoted; in the full profile a new standby is then made
of the new primary and the failover repeats.

Synchronous replication loses no acknowledged commit, so: no acknowledged enqueue is
lost, no job completes twice, no two attempts overlap (invariants 1-7), and every
acknowledged job succeeds. Figures: how soon after the promotion each worker started
a job again and the producer enqueued again.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conformance.support import enqueue_one
from tests.conftest import IN_CI
from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.faultapp import build_app
from tests.faults.harness import (
    Db,
    active_count,
    first_starts,
    percentiles,
    wait_all_done,
    wait_for,
)
from tests.faults.hosts import HostNet
from tests.faults.replication import ReplicatedPair
from tests.pgcluster import bindir
from tether import AppConfig
from tether.store import create_store

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    """A private primary with a synchronous standby, removed afterwards."""
    found = bindir()
    if found is None or not (found / "pg_basebackup").is_file():
        if IN_CI:
            pytest.fail("CI needs PostgreSQL's initdb, pg_ctl and pg_basebackup")
        pytest.skip("PostgreSQL's server binaries are not installed")
    made = ReplicatedPair(found, synchronous=True)
    try:
        made.setup()
        yield made
    finally:
        made.destroy()


async def failover(s: Scenario, pair: ReplicatedPair, names: list[str]) -> dict[str, Any]:
    """Crash the primary while every worker holds work; promote the standby after
    ``gap_s``; wait until every worker started a job again."""
    wids = {n: s.cluster.worker_id(n) for n in names}
    await wait_for(lambda: all(s.db.running_of_worker(w) for w in wids.values()), 30)
    procs = {s.cluster.procs[n].key for n in names}
    t_crash = time.time()
    crashed = pair.primary.port
    await asyncio.to_thread(pair.crash_primary)
    s.history.add("primary_crashed", port=crashed)
    await asyncio.sleep(s.params["gap_s"])
    t_promote = time.time()
    await asyncio.to_thread(pair.promote)
    t_promoted = time.time()
    s.history.add("standby_promoted", port=pair.primary.port, took=t_promoted - t_promote)
    back = await wait_for(
        lambda: (got := first_starts(s.run_dir, t_promote)) and procs <= set(got) and got,
        60,
        every=0.1,
    )
    await wait_for(lambda: any(op["sent"] > t_promote for op in s.history.of("enqueued")), 30)
    enq = [op["t"] for op in s.history.of("enqueued") if op["sent"] > t_promote]
    return {
        "crash": t_crash,
        "promote": t_promote,
        "promote_s": t_promoted - t_promote,
        "workers_back": [back[p] - t_promote for p in procs],
        "producer_back": min(enq) - t_promote,
    }


async def test_failover_to_synchronous_standby(
    scenario: MakeScenario, hosts: HostNet, pair: ReplicatedPair
) -> None:
    s = await scenario("failover", pg_admin=pair.primary.admin_url, concurrency=2, claim_batch=2)
    p = s.params
    # Everyone, the test's own view included, goes through the multi-host URL.
    url = pair.url(s.url.rsplit("/", 1)[1])
    await s.app.close()
    s.url, s.db, s.cluster.url = url, Db(url), url
    s.app = build_app(url)
    s.app.config = AppConfig(wait_poll_interval=0.1)
    names = ["f0", "f1", "f2"]
    for name, host in zip(names, hosts.add(len(names)), strict=True):
        s.cluster.start(name, url=host.url(url), host=host.command)
    await wait_for(
        lambda: len(s.db.query("SELECT 1 FROM tether_workers WHERE state = 'active'")) == 3, 30
    )
    rng = random.Random(15)
    stop = asyncio.Event()
    await s.enqueue("work", [{"ms": rng.randint(*p["ms"])} for _ in range(12)])
    producer = asyncio.create_task(s.trickle(rng, stop))
    rounds = []
    try:
        for r in range(p["failovers"]):
            if r:
                await asyncio.to_thread(pair.rebuild)
                s.history.add("standby_rebuilt", port=pair.standby.port)
            await asyncio.sleep(p["warm_s"])
            rounds.append(await failover(s, pair, names))
        await asyncio.sleep(p["after_s"])
    finally:
        stop.set()
        await producer
    await wait_all_done(s.db, 90)
    alive = s.cluster.alive()
    codes = await s.cluster.stop_all()

    acked = s.history.acked()
    present = {int(r[0]) for r in s.db.query("SELECT id FROM tether_jobs")}
    # What the database said, for a failure's post-mortem (the clusters go with the test).
    (s.run_dir / "events.json").write_text(json.dumps(s.db.events()))
    (s.run_dir / "workers.json").write_text(
        json.dumps(s.db.query("SELECT * FROM tether_workers"), default=str)
    )
    verdict = s.check(must_succeed=acked)
    dead = [
        e
        for e in s.db.events()
        if e["actor"] == "rescuer" and str(e["reason"]).startswith("worker dead")
    ]
    back = percentiles([t for r in rounds for t in r["workers_back"]])
    s.figures = {
        "failovers": len(rounds),
        "synchronous": pair.synchronous,
        "gap_s": p["gap_s"],
        "promote_s_max": max(r["promote_s"] for r in rounds),
        "jobs": verdict.figures["jobs"],
        "acked": len(acked),
        "acked_lost": len(acked - present),
        "enqueues_failed": len(s.history.of("enqueue_failed")),
        "unacked_committed": len(present - acked),
        "worker_recovery_p50": back["p50"],
        "worker_recovery_max": back["max"],
        "producer_recovery_max": max(r["producer_back"] for r in rounds),
        "overlaps": verdict.figures["overlaps"],
        "live_rescues": verdict.figures["live_rescues"],
        "rescued_worker_dead": len(dead),
        "reruns": verdict.figures["reruns"],
        "stale_rejected": verdict.figures["stale_rejected"],
        "restarts": s.cluster.restarts,
    }
    assert not verdict.violations, (
        f"{len(verdict.violations)} invariant violation(s) in {s.run_dir}:\n" + verdict.summary()
    )
    assert sorted(alive) == names and all(c == 0 for c in codes.values()), (alive, codes)
    assert active_count(s.db) == 0


async def test_a_job_claimed_after_a_failover_is_not_rescued_as_a_dead_workers(
    pg_url: str,
) -> None:
    """The state the failover scenario reaches when it fails, made on purpose: after a
    failover the worker's recorded LISTEN session is not on the new primary, its
    heartbeat has been failing for longer than the grace, and its claimer got through
    before its heartbeater (whose backoff is longer). The lease just granted is fresh:
    the worker is alive, and the rescuer must not take that job from it."""
    store = create_store(pg_url)
    await store.open()
    try:
        await store.migrate()
        wid = "vm:1:w#1"
        await store.register_worker(wid, None, "vm", 1, None, ["default"], 1)
        Db(pg_url).query(
            "UPDATE tether_workers SET backend_pid = 2147483647, "
            "heartbeat_at = now() - interval '5 seconds' WHERE id = %s",
            (wid,),
        )
        await enqueue_one(store)
        [claimed] = await store.claim(wid, ["default"], ["t"], 1, 3.0)
        await store.mark_dead_workers(lambda _process: False, 2.5)
        rescued = [(j.id, j.error) for j in await store.rescue()]
        assert claimed.id not in [r[0] for r in rescued], (
            f"a lease granted a moment ago was revoked: {rescued}"
        )
    finally:
        await store.close()
