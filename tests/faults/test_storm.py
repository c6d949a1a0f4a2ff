"""Scenario 1 (and 12a on SQLite): a SIGKILL storm while jobs are being enqueued."""

from __future__ import annotations

import asyncio
import random
import signal
import time

import pytest

from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.harness import (
    active_count,
    percentiles,
    recovery_times,
    rescue_times,
    wait_all_done,
)

pytestmark = pytest.mark.slow


async def produce(s: Scenario, n: int, seconds: float, ms: tuple[int, int], seed: int) -> None:
    """Enqueue ``n`` jobs in batches spread over ``seconds``, each acknowledged batch
    recorded in the history."""
    rng = random.Random(seed)
    batch = max(1, n // max(1, int(seconds / 0.1)))
    left = n
    while left > 0:
        size = min(batch, left)
        await s.enqueue("work", [{"ms": rng.randint(*ms)} for _ in range(size)])
        left -= size
        await asyncio.sleep(0.1)


async def storm(s: Scenario, seed: int) -> None:
    p = s.params
    rng = random.Random(seed)
    names = [f"w{i}" for i in range(p["workers"])]
    for name in names:
        s.cluster.start(name)
    s.supervise()
    # The load is half the workers' capacity, so that a recovery time measures the
    # recovery rather than a backlog; the kills are spread over the whole run.
    capacity = p["workers"] * p["concurrency"] / (sum(p["ms"]) / 2 / 1000)
    spread = p["jobs"] / (0.5 * capacity)
    gap = spread / p["kills"]
    kill_every = (0.6 * gap, 1.4 * gap)
    producer = asyncio.create_task(produce(s, p["jobs"], spread, tuple(p["ms"]), seed))
    started = time.monotonic()
    kills = 0
    while kills < p["kills"]:
        await asyncio.sleep(rng.uniform(*kill_every))
        # Prefer a victim that holds jobs, so that every kill costs some work.
        alive = s.cluster.alive()
        holding = [(n, s.db.running_of(s.cluster.pid(n))) for n in alive]
        candidates = [(n, held) for n, held in holding if held] or holding
        if not candidates:
            continue
        name, held = rng.choice(candidates)
        pid = s.cluster.pid(name)
        s.history.add("kill", name=name, pid=pid, held=held)
        s.cluster.signal(name, signal.SIGKILL)
        kills += 1
        if producer.done() and active_count(s.db) == 0:
            break  # nothing left to disturb
    await producer
    await wait_all_done(s.db, timeout=60 + p["jobs"] * 0.05)
    run_time = time.monotonic() - started
    await asyncio.sleep(0.5)  # the supervisor restarts the last victim
    await s.unsupervise()
    codes = await s.cluster.stop_all()
    assert all(c == 0 for c in codes.values()), f"workers did not stop cleanly: {codes}"

    if s.sqlite:
        check = s.db.query("PRAGMA integrity_check")
        s.figures["integrity_check"] = check[0][0]
        assert [r[0] for r in check] == ["ok"], check
    verdict = s.assert_invariants(must_succeed=s.history.acked())
    events = s.db.events()
    rec = recovery_times(s.history.of("kill"), events)
    pct = percentiles(rec)
    freed = percentiles(rescue_times(s.history.of("kill"), events))
    s.figures = {
        "jobs": verdict.figures["jobs"],
        "kills": kills,
        "restarts": s.cluster.restarts,
        "recovery_p50": pct["p50"],
        "recovery_p99": pct["p99"],
        "recovery_max": pct["max"],
        "rescue_p50": freed["p50"],
        "rescue_max": freed["max"],
        "jobs_recovered": len(rec),
        "reruns": verdict.figures["reruns"],
        "stale_rejected": verdict.figures["stale_rejected"],
        "effects_superseded": verdict.figures["effects_superseded"],
        "run_seconds": run_time,
        **({"integrity_check": s.figures["integrity_check"]} if s.sqlite else {}),
    }
    assert verdict.figures["acked"] == p["jobs"]
    # How fast the jobs came back is a figure of the report (conftest.TARGETS), not an
    # assertion: on a loaded machine it varies while the invariants hold.


async def test_sigkill_storm(scenario: MakeScenario) -> None:
    s = await scenario("storm")
    s.cluster.config.update(
        concurrency=s.params["concurrency"], claim_batch=s.params["concurrency"]
    )
    await storm(s, seed=1)


async def test_sqlite_sigkill_storm(scenario: MakeScenario) -> None:
    s = await scenario("sqlite_storm", store="sqlite")
    s.cluster.config.update(
        concurrency=s.params["concurrency"], claim_batch=s.params["concurrency"]
    )
    await storm(s, seed=2)
