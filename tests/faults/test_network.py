"""Scenarios 5, 6 and 7: the database goes away, in three ways.

5. PostgreSQL restart (of a private throwaway cluster): workers reconnect by
   themselves with LISTEN re-established, and a job enqueued after each restart starts
   through NOTIFY, not the poll interval.
6. LISTEN connection killed (``pg_terminate_backend``): it comes back, and no wake-up
   is lost for longer than the poll interval.
7. Partition (the fault proxy blackholes, or resets, one worker's connections, after a
   phase of added latency that must cost no lease): the worker stops its own jobs
   before their leases end; after healing the invariants hold; while the partition
   lasts its log stays bounded.

Workers poll only every ``POLL`` seconds here, so a start faster than that came from
a notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.harness import (
    active_count,
    percentiles,
    read_exec_log,
    wait_all_done,
    wait_for,
)
from tests.faults.proxy import FaultProxy
from tests.pgcluster import PrivateCluster
from tether import StoreError

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

POLL = 4.0


def first_start(s: Scenario, job: int) -> float | None:
    for e in read_exec_log(s.run_dir):
        if e["ev"] == "start" and e["job"] == job:
            return float(e["t"])
    return None


async def start_latency(s: Scenario, job: int, since: float, timeout: float = 30) -> float:
    started = await wait_for(lambda: first_start(s, job), timeout, every=0.02)
    return float(started) - since


async def enqueue_retrying(s: Scenario, task: str, args: list[dict[str, Any]]) -> list[int]:
    """Enqueue, retrying while the database is away (an unacknowledged try may still
    have committed: the checker sees such jobs too)."""
    for _ in range(200):
        try:
            return await s.enqueue(task, args)
        except StoreError:
            await asyncio.sleep(0.1)
    raise AssertionError("could not enqueue for 20 s")


async def listeners_back(s: Scenario, n: int, old: list[int], timeout: float = 30) -> float:
    t = time.monotonic()
    await wait_for(
        lambda: len(pids := s.db.listener_pids()) == n and not set(pids) & set(old),
        timeout,
        every=0.05,
    )
    return time.monotonic() - t


async def test_listen_connection_killed(scenario: MakeScenario) -> None:
    s = await scenario("listen_kill", poll_interval=POLL)
    for name in ("w0", "w1"):
        s.cluster.start(name)
    await wait_for(lambda: len(s.db.listener_pids()) == 2, 30)
    gap, after, back = [], [], []
    for _ in range(s.params["kills"]):
        old = s.db.listener_pids()
        t_kill = time.time()
        killed = s.db.terminate(old)
        s.history.add("terminate_listeners", pids=old, killed=killed)
        # Enqueued while the listeners are away: the reconnect (or the poll) must find it.
        t_during = time.time()
        (during,) = await s.enqueue("work", [{"ms": 10}])
        back.append(await listeners_back(s, 2, old))
        t_later = time.time()
        (later,) = await s.enqueue("work", [{"ms": 10}])
        gap.append(await start_latency(s, during, t_during))
        after.append(await start_latency(s, later, t_later))
        s.history.add("listen_round", killed_at=t_kill, gap=gap[-1], after=after[-1])
        await asyncio.sleep(0.3)
    await wait_all_done(s.db, 30)
    await s.cluster.stop_all()
    verdict = s.assert_invariants(must_succeed=s.history.acked())
    g, a, b = percentiles(gap), percentiles(after), percentiles(back)
    s.figures = {
        "kills": s.params["kills"],
        "relisten_p50": b["p50"],
        "relisten_max": b["max"],
        "start_during_gap_max": g["max"],
        "start_after_relisten_p50": a["p50"],
        "start_after_relisten_max": a["max"],
        "poll_interval": POLL,
        "jobs": verdict.figures["jobs"],
    }
    # Every probe started (start_latency waits for it); how soon is a figure of the
    # report (conftest.TARGETS).
    assert g["max"] is not None and a["max"] is not None, s.figures


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


def _line_count(s: Scenario, name: str) -> int:
    """Log records (a traceback or a multi-line message counts once)."""
    return sum(1 for line in s.cluster.log_lines(name) if line[:1].isdigit())


@pytest.mark.parametrize("mode", ["blackhole", "reset"])
async def test_partition(scenario: MakeScenario, mode: str) -> None:
    s = await scenario(f"partition_{mode}", params="partition", concurrency=3, claim_batch=3)
    seconds = s.params["seconds"]
    target = urlsplit(s.url)
    proxy = FaultProxy(target.hostname or "127.0.0.1", target.port or 5432)
    port = proxy.start()
    try:
        s.cluster.start("wp", url=_via(s.url, port))
        s.cluster.start("wd")
        await wait_for(
            lambda: len(s.db.query("SELECT 1 FROM tether_workers WHERE state = 'active'")) == 2,
            30,
        )
        wp_pid = s.cluster.pid("wp")
        await s.enqueue("work", [{"ms": 5000}] * 6)
        held = await wait_for(lambda: s.db.running_of(wp_pid), 30)
        # First a slow link (0.2 s more each way, on every chunk): the leases survive it.
        t_slow = time.time()
        proxy.set_latency(0.2)
        await asyncio.sleep(2.0)
        proxy.set_latency(0.0)
        slow_rescues = [
            e
            for e in s.db.events()
            if e["actor"] == "rescuer"
            and e["at"] > t_slow
            and str(e["worker"]).count(f":{wp_pid}:")
        ]
        held = s.db.running_of(wp_pid)
        lines_before = _line_count(s, "wp")
        (proxy.blackhole if mode == "blackhole" else proxy.reset)()
        s.history.add("partition", mode=mode, held=held)
        await asyncio.sleep(0.5)  # let writes already in the database land
        expiry = {
            int(r[0]): float(r[1])
            for r in s.db.query(
                "SELECT id, extract(epoch FROM lease_expires_at) FROM tether_jobs "
                "WHERE state = 'running' AND worker_id LIKE %s",
                (f"%:{wp_pid}:%",),
            )
        }
        # Work keeps coming while the partition lasts; the healthy worker takes it.
        during = await s.enqueue("work", [{"ms": 200}] * 6)
        await asyncio.sleep(max(0.0, seconds - 0.5))
        lines_during = _line_count(s, "wp") - lines_before
        t_heal = time.time()
        proxy.heal()
        s.history.add("heal", mode=mode)
        # After healing, the partitioned worker takes part again.
        after = await s.enqueue("work", [{"ms": 300}] * 12)
        # The partitioned worker rejoins by itself: it claims work again (more work is
        # enqueued while the healthy worker keeps finishing it).
        rejoined = None
        deadline = time.monotonic() + 45
        while rejoined is None and time.monotonic() < deadline:
            starts = [
                e["t"]
                for e in read_exec_log(s.run_dir)
                if e["ev"] == "start" and e["pid"] == wp_pid and e["t"] > t_heal
            ]
            if starts:
                rejoined = min(starts) - t_heal
            elif active_count(s.db) < 3:
                after += await s.enqueue("work", [{"ms": 300}] * 6)
            await asyncio.sleep(0.25)
        await wait_all_done(s.db, 60)
        assert s.cluster.procs["wp"].popen.poll() is None, "the partitioned worker died"
        codes = await s.cluster.stop_all()
    finally:
        proxy.stop()
    execs = read_exec_log(s.run_dir)
    fenced_early = late = 0
    margins = []
    for job, deadline in expiry.items():
        # Stopped: told to stop (a handler may still sit in a database call, which
        # the fence makes harmless), or ended.
        ends = [
            e
            for e in execs
            if e["ev"] in ("stop", "end") and e["job"] == job and e["pid"] == wp_pid
        ]
        if ends and ends[0]["t"] < deadline:
            fenced_early += 1
            margins.append(deadline - ends[0]["t"])
        else:
            late += 1
    wp_id = s.db.query("SELECT id FROM tether_workers WHERE id LIKE %s", (f"%:{wp_pid}:%",))[0][0]
    wp_after = [e for e in execs if e["ev"] == "start" and e["pid"] == wp_pid and e["job"] in after]
    # Jobs the partitioned worker claimed once healed (a claim sent during the partition
    # and answered on healing is stopped by the fence: its lease's start is unknown)
    # must never be taken from it: it was presumed dead, but it is alive.
    rescued_after_heal = []
    last_claim: dict[int, float] = {}
    for e in s.db.events():  # oldest first
        if e["dst"] == "running":
            last_claim[e["job"]] = e["at"]
        elif (
            e["actor"] == "rescuer"
            and e["worker"] == wp_id
            and last_claim.get(e["job"], 0.0) > t_heal + 1
        ):
            rescued_after_heal.append(e)
    verdict = s.assert_invariants(must_succeed=s.history.acked())
    m = percentiles(margins)
    s.figures = {
        "mode": mode,
        "partition_s": seconds,
        "rescued_while_slow": len(slow_rescues),
        "jobs_cut_off": len(expiry),
        "stopped_before_lease_end": fenced_early,
        "stopped_late": late,
        "fence_margin_min": min(margins) if margins else None,
        "fence_margin_p50": m["p50"],
        "log_lines_during": lines_during,
        "wp_jobs_after_heal": len(wp_after),
        "rejoin_s": rejoined,
        "rescued_after_heal": len(rescued_after_heal),
        "stale_rejected": verdict.figures["stale_rejected"],
        "reruns": verdict.figures["reruns"],
        "exit_codes": ",".join(str(c) for c in codes.values()),
        "proxy_resets": proxy.stats.resets,
    }
    assert late == 0, s.figures
    assert not slow_rescues, slow_rescues
    assert rejoined is not None, s.figures  # it came back by itself
    assert lines_during <= 40, s.figures  # the same for 6 s and for 30 s
    assert not rescued_after_heal, rescued_after_heal[:3]
    assert all(c == 0 for c in codes.values()), s.figures
    assert during  # used: the healthy worker ran them (checked by the invariants)


async def test_postgres_restart(scenario: MakeScenario, private_pg: PrivateCluster) -> None:
    # A private cluster of this session's own: restarting a shared server would break
    # whoever else uses it, so this runs in every profile.
    s = await scenario("pg_restart", pg_admin=private_pg.admin_url, poll_interval=POLL)
    for name in ("w0", "w1"):
        s.cluster.start(name)
    await wait_for(lambda: len(s.db.listener_pids()) == 2, 30)
    rng = random.Random(5)
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            with contextlib.suppress(StoreError):
                await s.enqueue("work", [{"ms": rng.randint(50, 300)} for _ in range(4)])
            await asyncio.sleep(0.2)

    producer = asyncio.create_task(produce())
    downtime, relisten, latency = [], [], []
    try:
        for _ in range(s.params["restarts"]):
            await asyncio.sleep(2.0)
            old = s.db.listener_pids()
            t = time.monotonic()
            s.history.add("pg_restart")
            try:
                await asyncio.to_thread(private_pg.restart)
            finally:
                await asyncio.to_thread(private_pg.ensure_started)
            downtime.append(time.monotonic() - t)
            relisten.append(await listeners_back(s, 2, old))
            t_probe = time.time()
            (probe,) = await enqueue_retrying(s, "work", [{"ms": 10}])
            latency.append(await start_latency(s, probe, t_probe))
            s.history.add("pg_restart_round", relisten=relisten[-1], probe=latency[-1])
    finally:
        stop.set()
        await producer
        await asyncio.to_thread(private_pg.ensure_started)
    await wait_all_done(s.db, 60)
    alive = s.cluster.alive()
    codes = await s.cluster.stop_all()
    verdict = s.assert_invariants(must_succeed=s.history.acked())
    lat, back = percentiles(latency), percentiles(relisten)
    s.figures = {
        "restarts": s.params["restarts"],
        "restart_s_max": max(downtime),
        "relisten_p50": back["p50"],
        "relisten_max": back["max"],
        "probe_start_p50": lat["p50"],
        "probe_start_max": lat["max"],
        "poll_interval": POLL,
        "jobs": verdict.figures["jobs"],
        "reruns": verdict.figures["reruns"],
        "stale_rejected": verdict.figures["stale_rejected"],
    }
    assert len(alive) == 2 and all(c == 0 for c in codes.values()), (alive, codes)
    assert lat["max"] is not None, s.figures  # how soon: a figure (conftest.TARGETS)
