"""Scenario 13 (and 13a on SQLite): workers on "hosts" with one name.

Four workers share this machine's host name: two in this PID namespace, two each in a
PID namespace of its own, as containers sharing the host's name or two VMs both called
``ubuntu`` would be. While they work through a backlog, workers in every namespace are
SIGKILLed (and restarted) and SIGSTOPped for longer than their lease (then SIGCONTed).

A pid means nothing across namespaces, so no worker may judge another dead by a pid
check there: a killed worker's jobs come back through its lost session (PostgreSQL) or
its expired leases, a frozen worker's through its expired leases, and no live worker's
job is ever taken from it. The invariants (7: no overlapping attempts, no rescue from a
live worker) hold, and every job succeeds.
"""

from __future__ import annotations

import asyncio
import collections
import random
import signal

import pytest

from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.faultapp import BASE_CONFIG
from tests.faults.harness import percentiles, rescue_times, wait_all_done, wait_for
from tests.helpers import can_unshare

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not can_unshare(), reason="needs unshare --pid (root or user namespaces)"),
]

LEASE = float(BASE_CONFIG["lease_duration"])
WORKERS = {"h0": False, "h1": False, "ns0": True, "ns1": True}  # name: own PID namespace
# One round of faults, each kind in both kinds of namespace: (fault, worker).
ROUND = [("kill", "ns0"), ("stop", "h0"), ("kill", "h1"), ("stop", "ns1")]


async def freeze(s: Scenario, name: str, seconds: float) -> None:
    s.cluster.signal(name, signal.SIGSTOP)
    await asyncio.sleep(seconds)
    s.cluster.signal(name, signal.SIGCONT)


async def multihost(s: Scenario, seed: int) -> None:
    p = s.params
    rng = random.Random(seed)
    for name, own_ns in WORKERS.items():
        s.cluster.start(name, own_pid_namespace=own_ns)
    await s.registered(WORKERS)
    s.supervise()
    hosts = s.db.query("SELECT DISTINCT host FROM tether_workers")
    assert len(hosts) == 1, hosts  # one host name for all of them
    await s.enqueue("work", [{"ms": rng.randint(*p["ms"])} for _ in range(p["jobs"])])
    kills, freezes = [], []
    thaws: list[asyncio.Task[None]] = []
    for _ in range(p["rounds"]):
        for fault, name in ROUND:
            # A victim that holds work, so that every fault costs some.
            await wait_for(lambda name=name: s.db.running_of_worker(s.cluster.worker_id(name)), 30)
            held = s.db.running_of_worker(s.cluster.worker_id(name))
            if fault == "kill":
                kills.append(s.history.add("kill", name=name, pid=s.cluster.pid(name), held=held))
                s.cluster.signal(name, signal.SIGKILL)
            else:
                freezes.append(s.history.add("freeze", name=name, held=held))
                thaws.append(asyncio.create_task(freeze(s, name, 1.5 * LEASE)))
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            # Keep a backlog, so that every worker stays busy.
            if s.db.counts().get("queued", 0) < 10:
                await s.enqueue("work", [{"ms": rng.randint(*p["ms"])} for _ in range(20)])
    await asyncio.gather(*thaws)
    await wait_all_done(s.db, timeout=120)
    await asyncio.sleep(0.5)  # the supervisor restarts the last victim
    await s.unsupervise()
    codes = await s.cluster.stop_all()
    assert all(c == 0 for c in codes.values()), f"workers did not stop cleanly: {codes}"

    verdict = s.assert_invariants(must_succeed=s.history.acked())
    events = s.db.events()
    reasons = collections.Counter(
        str(e["reason"]).split(" (")[0] for e in events if e["actor"] == "rescuer"
    )
    freed_kill = percentiles(rescue_times(kills, events))
    freed_freeze = percentiles(rescue_times(freezes, events))
    s.figures = {
        "jobs": verdict.figures["jobs"],
        "namespaces": 1 + sum(WORKERS.values()),
        "kills": len(kills),
        "freezes": len(freezes),
        "restarts": s.cluster.restarts,
        "overlaps": verdict.figures["overlaps"],
        "live_rescues": verdict.figures["live_rescues"],
        "rescued_worker_dead": reasons.get("worker dead", 0),
        "rescued_lease_expired": reasons.get("lease expired", 0),
        "kill_rescue_p50": freed_kill["p50"],
        "kill_rescue_max": freed_kill["max"],
        "freeze_rescue_p50": freed_freeze["p50"],
        "executions": verdict.figures["executions"],
        "reruns": verdict.figures["reruns"],
        "stale_rejected": verdict.figures["stale_rejected"],
    }


async def test_multihost_namespaces(scenario: MakeScenario) -> None:
    s = await scenario("multihost")
    s.cluster.config.update(
        concurrency=s.params["concurrency"], claim_batch=s.params["concurrency"]
    )
    await multihost(s, seed=13)


async def test_sqlite_multihost_namespaces(scenario: MakeScenario) -> None:
    s = await scenario("sqlite_multihost", store="sqlite")
    s.cluster.config.update(
        concurrency=s.params["concurrency"], claim_batch=s.params["concurrency"]
    )
    await multihost(s, seed=14)
