"""Scenario 14: workers on hosts of their own, cut off and slowed down.

Three workers, each on a "host" (:mod:`tests.faults.hosts`): a network namespace linked
to this one by a veth pair, and a PID namespace of its own. PostgreSQL (the shared
server, on loopback here) is reachable from a host only over its link, through a
forwarder on the link's root side. While a producer keeps work flowing, each round:

1. one host's link is slowed down (every chunk through its forwarder delayed): no
   lease may be lost to that;
2. another host's link goes down (``ip link set ... down``) for longer than a lease;
3. the third host's traffic is dropped by iptables rules inside its namespace, as long.

A cut-off worker stops its jobs before their leases end and the others rescue them
after; no attempt overlaps another (invariant 7); once its link heals the worker takes
work again by itself, without a restart. Every acknowledged job succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import pytest

from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.faultapp import BASE_CONFIG
from tests.faults.harness import active_count, percentiles, read_exec_log, wait_all_done, wait_for
from tests.faults.hosts import Host, HostNet
from tether import StoreError

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

LEASE = float(BASE_CONFIG["lease_duration"])


async def produce(s: Scenario, rng: random.Random, stop: asyncio.Event, keep: int) -> None:
    """Keep about ``keep`` jobs waiting or running until ``stop``."""
    while not stop.is_set():
        if active_count(s.db) < keep:
            with contextlib.suppress(StoreError):
                await s.enqueue("work", [{"ms": rng.randint(*s.params["ms"])} for _ in range(6)])
        await asyncio.sleep(0.3)


def expiries(s: Scenario, worker_id: str | None) -> dict[int, float]:
    """Lease expiry (Unix seconds, the server's clock) of the worker's running jobs."""
    rows = s.db.query(
        "SELECT id, extract(epoch FROM lease_expires_at) FROM tether_jobs "
        "WHERE state = 'running' AND worker_id = %s",
        (worker_id,),
    )
    return {int(r[0]): float(r[1]) for r in rows}


async def first_start_after(s: Scenario, proc: str, since: float, timeout: float) -> float | None:
    """Seconds from ``since`` until ``proc`` started a job, or ``None``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        starts = [
            e["t"]
            for e in read_exec_log(s.run_dir)
            if e["ev"] == "start" and e["proc"] == proc and e["t"] > since
        ]
        if starts:
            return float(min(starts)) - since
        await asyncio.sleep(0.1)
    return None


async def cut_off(s: Scenario, host: Host, name: str, how: str, seconds: float) -> dict[str, Any]:
    """Cut ``name``'s host off for ``seconds`` while it holds work; heal; wait until it
    works again."""
    wid = s.cluster.worker_id(name)
    await wait_for(lambda: s.db.running_of_worker(wid), 30)
    proc = s.cluster.procs[name].key
    t_cut = time.time()
    (host.link_down if how == "link" else host.drop)()
    s.history.add("partition", name=name, how=how, proc=proc, host=host.name)
    await asyncio.sleep(0.5)  # let writes already on their way land
    expiry = expiries(s, wid)
    await asyncio.sleep(max(0.0, seconds - 0.5))
    t_heal = time.time()
    host.heal()
    s.history.add("heal", name=name, how=how, host=host.name)
    rejoin = await first_start_after(s, proc, t_heal, 45)
    return {"how": how, "proc": proc, "wid": wid, "cut": t_cut, "expiry": expiry, "rejoin": rejoin}


async def slow_link(s: Scenario, host: Host, name: str, seconds: float) -> dict[str, Any]:
    """Delay ``name``'s link by 0.2 s a chunk each way for ``seconds`` while it works."""
    wid = s.cluster.worker_id(name)
    await wait_for(lambda: s.db.running_of_worker(wid), 30)
    t = time.time()
    host.slow(0.2)
    s.history.add("slow", name=name, host=host.name, latency=0.2)
    await asyncio.sleep(seconds)
    host.slow(0.0)
    s.history.add("fast", name=name, host=host.name)
    return {"wid": wid, "from": t, "to": time.time() + 1.0}


async def test_hosts_partitioned_and_slowed(scenario: MakeScenario, hosts: HostNet) -> None:
    s = await scenario("hosts", concurrency=2, claim_batch=2)
    p = s.params
    names = ["h0", "h1", "h2"]
    made = dict(zip(names, hosts.add(len(names)), strict=True))
    for name, host in made.items():
        s.cluster.start(name, url=host.url(s.url), host=host.command)
    await wait_for(
        lambda: len(s.db.query("SELECT 1 FROM tether_workers WHERE state = 'active'")) == 3, 30
    )
    # Each worker reaches the database only over its own link: not directly.
    direct = [n for n, h in made.items() if h.reachable(s.db.url)]
    rng = random.Random(14)
    stop = asyncio.Event()
    producer = asyncio.create_task(produce(s, rng, stop, keep=p["keep"]))
    cuts: list[dict[str, Any]] = []
    slows: list[dict[str, Any]] = []
    try:
        await s.enqueue("work", [{"ms": rng.randint(*p["ms"])} for _ in range(p["keep"])])
        for r in range(p["rounds"]):
            slow, link, drop = (names[(r + i) % 3] for i in range(3))
            slows.append(await slow_link(s, made[slow], slow, p["slow_s"]))
            cuts.append(await cut_off(s, made[link], link, "link", p["seconds"]))
            cuts.append(await cut_off(s, made[drop], drop, "drop", p["seconds"]))
    finally:
        stop.set()
        await producer
        for host in made.values():
            host.heal()
    await wait_all_done(s.db, 90)
    alive = s.cluster.alive()
    codes = await s.cluster.stop_all()

    execs = read_exec_log(s.run_dir)
    events = s.db.events()
    margins, rescue_delays = [], []
    late = []
    unstarted = 0
    for cut in cuts:
        for job, deadline in cut["expiry"].items():
            # Stopped: told to stop (a handler may still sit in a database call, which the
            # fence makes harmless), or ended.
            ends = [
                e["t"]
                for e in execs
                if e["ev"] in ("stop", "end")
                and e["job"] == job
                and e["proc"] == cut["proc"]
                and e["t"] >= cut["cut"] - 5
            ]
            started = any(
                e["ev"] == "start" and e["job"] == job and e["proc"] == cut["proc"] for e in execs
            )
            if not started:
                # Claimed in the database, but the answer was lost in the cut: the
                # worker never ran it, so there was nothing to stop (the rescue frees it).
                unstarted += 1
            elif ends and min(ends) < deadline:
                margins.append(deadline - min(ends))
            else:
                late.append((cut["how"], job, deadline, min(ends) if ends else None))
            freed = [
                e["at"]
                for e in events
                if e["job"] == job and e["actor"] == "rescuer" and e["at"] >= cut["cut"]
            ]
            if freed:
                rescue_delays.append(min(freed) - cut["cut"])
    slow_rescues = [
        e
        for w in slows
        for e in events
        if e["actor"] == "rescuer" and e["worker"] == w["wid"] and w["from"] <= e["at"] <= w["to"]
    ]
    rejoins = [c["rejoin"] for c in cuts]
    verdict = s.check(must_succeed=s.history.acked())
    m, rd = percentiles(margins), percentiles(rescue_delays)
    known = [x for x in rejoins if x is not None]
    s.figures = {
        "hosts": len(made),
        "jobs": verdict.figures["jobs"],
        "partitions": len(cuts),
        "partition_s": p["seconds"],
        "jobs_cut_off": sum(len(c["expiry"]) for c in cuts),
        "stopped_before_lease_end": len(margins),
        "stopped_late": len(late),
        "claims_lost_in_cut": unstarted,
        "fence_margin_min": min(margins) if margins else None,
        "fence_margin_p50": m["p50"],
        "rescue_after_cut_p50": rd["p50"],
        "rescue_after_cut_max": rd["max"],
        "rejoin_max": max(known) if known else None,
        "rescued_while_slow": len(slow_rescues),
        "overlaps": verdict.figures["overlaps"],
        "live_rescues": verdict.figures["live_rescues"],
        "reruns": verdict.figures["reruns"],
        "stale_rejected": verdict.figures["stale_rejected"],
        "restarts": s.cluster.restarts,
    }
    assert not verdict.violations, (
        f"{len(verdict.violations)} invariant violation(s) in {s.run_dir}:\n" + verdict.summary()
    )
    assert not direct, f"hosts reach the database without their link: {direct}"
    assert all(px.stats.accepted for h in made.values() for px in h.forwards.values())
    assert not late, f"jobs not stopped before their lease ended: {late}; {s.figures}"
    assert not slow_rescues, slow_rescues[:3]
    assert None not in rejoins, f"a worker did not come back after healing: {s.figures}"
    assert sorted(alive) == names and all(c == 0 for c in codes.values()), (alive, codes)
