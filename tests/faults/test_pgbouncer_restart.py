"""Scenario 16: the PgBouncer in front of PostgreSQL is killed and restarted.

A private PgBouncer in transaction mode (:mod:`tests.pgbouncer`) in front of the
session's private cluster. Two workers, each on a host of its own
(:mod:`tests.faults.hosts`), reach the pooler (``?pgbouncer=true``) and, for LISTEN
and their liveness session, the server directly (``listen_url``), both over their
links; a producer in this process enqueues through the pooler. While work flows, the
pooler is killed with SIGKILL (every client and server connection of it drops at once,
transactions in flight with them) and started again on the same port.

Nothing may be lost: every acknowledged enqueue is there and succeeds, no job completes
twice and no two attempts overlap (invariants 1-7). Figures: how soon after each
restart every worker started a job again and the producer enqueued again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.conftest import IN_CI
from tests.faults.conftest import MakeScenario
from tests.faults.faultapp import build_app
from tests.faults.harness import first_starts, percentiles, wait_all_done, wait_for
from tests.faults.hosts import HostNet
from tests.pgbouncer import PgBouncer, binary
from tests.pgcluster import PrivateCluster
from tether import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def bouncer_exe() -> str:
    exe = binary()
    if exe is None:
        if IN_CI:
            pytest.fail("CI installs pgbouncer: the pooler restart scenario must run there")
        pytest.skip("pgbouncer is not installed")
    return exe


def pooled(bouncer_url: str, direct: str) -> str:
    """The pooler's URL in PgBouncer mode, listening on ``direct``."""
    return f"{bouncer_url}?{urlencode({'pgbouncer': 'true', 'listen_url': direct})}"


def kill_bouncer(bouncer: PgBouncer) -> int:
    """SIGKILL the pgbouncer process itself (not the ``runuser`` above it)."""
    pid = int((bouncer.root / "pgbouncer.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    if bouncer._proc is not None:
        bouncer._proc.wait(10)
    return pid


async def test_pgbouncer_killed_and_restarted(
    scenario: MakeScenario, hosts: HostNet, private_pg: PrivateCluster, bouncer_exe: str
) -> None:
    private_pg.ensure_started()
    s = await scenario(
        "pgbouncer_restart", pg_admin=private_pg.admin_url, concurrency=2, claim_batch=2
    )
    p = s.params
    bouncer = PgBouncer(bouncer_exe, s.url, server_pool=10)
    bouncer.start()
    stop = asyncio.Event()
    producer: asyncio.Task[None] | None = None
    rounds: list[dict[str, Any]] = []
    names = ["b0", "b1"]
    try:
        await s.app.close()
        s.app = build_app(pooled(bouncer.url, s.url))
        s.app.config = AppConfig(wait_poll_interval=0.1)
        for name, host in zip(names, hosts.add(len(names)), strict=True):
            url = pooled(host.url(bouncer.url), host.url(s.url))
            s.cluster.start(name, url=url, host=host.command)
        await wait_for(
            lambda: len(s.db.query("SELECT 1 FROM tether_workers WHERE state = 'active'")) == 2,
            30,
        )
        rng = random.Random(16)
        await s.enqueue("work", [{"ms": rng.randint(*p["ms"])} for _ in range(8)])
        producer = asyncio.create_task(s.trickle(rng, stop))
        procs = {s.cluster.procs[n].key for n in names}
        for _ in range(p["restarts"]):
            await asyncio.sleep(p["every_s"])
            await wait_for(
                lambda: all(s.db.running_of_worker(s.cluster.worker_id(n)) for n in names), 30
            )
            t_kill = time.time()
            pid = kill_bouncer(bouncer)
            s.history.add("pgbouncer_killed", pid=pid)
            await asyncio.sleep(p["down_s"])
            t_start = time.time()
            await asyncio.to_thread(bouncer.start)
            s.history.add("pgbouncer_started", took=time.time() - t_start)
            back = await wait_for(
                lambda t=t_start: (got := first_starts(s.run_dir, t)) and procs <= set(got) and got,
                60,
                every=0.1,
            )
            await wait_for(
                lambda t=t_start: any(op["sent"] > t for op in s.history.of("enqueued")), 30
            )
            enq = min(op["t"] for op in s.history.of("enqueued") if op["sent"] > t_start)
            rounds.append(
                {
                    "kill": t_kill,
                    "workers_back": [back[x] - t_start for x in procs],
                    "producer_back": enq - t_start,
                }
            )
        await asyncio.sleep(p["after_s"])
    finally:
        stop.set()
        if producer is not None:
            await producer
        with contextlib.suppress(Exception):
            await wait_all_done(s.db, 90)
        alive = s.cluster.alive()
        codes = await s.cluster.stop_all()
        log = bouncer.log()
        bouncer.stop()
    (s.run_dir / "pgbouncer.log").write_text(log)

    acked = s.history.acked()
    present = {int(r[0]) for r in s.db.query("SELECT id FROM tether_jobs")}
    verdict = s.check(must_succeed=acked)
    back = percentiles([t for r in rounds for t in r["workers_back"]])
    s.figures = {
        "restarts": len(rounds),
        "down_s": p["down_s"],
        "jobs": verdict.figures["jobs"],
        "acked": len(acked),
        "acked_lost": len(acked - present),
        "enqueues_failed": len(s.history.of("enqueue_failed")),
        "unacked_committed": len(present - acked),
        "worker_recovery_p50": back["p50"],
        "worker_recovery_max": back["max"],
        "producer_recovery_max": max((r["producer_back"] for r in rounds), default=None),
        "overlaps": verdict.figures["overlaps"],
        "live_rescues": verdict.figures["live_rescues"],
        "reruns": verdict.figures["reruns"],
        "stale_rejected": verdict.figures["stale_rejected"],
        "restarts_of_workers": s.cluster.restarts,
    }
    assert not verdict.violations, (
        f"{len(verdict.violations)} invariant violation(s) in {s.run_dir}:\n" + verdict.summary()
    )
    assert sorted(alive) == sorted(names) and all(c == 0 for c in codes.values()), (alive, codes)
