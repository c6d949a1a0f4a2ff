"""Scenario 14 (and 14a on SQLite): every kind of job at once, through real workers.

While three workers run, the test enqueues in bulk, builds workflows (parents that fan
out to children and wait for them with ``WaitForChildren``, some failing in their fan-in
on purpose), dependency chains (``enqueue_workflow``, and ``depends_on`` on a job that
is running), and enqueues inside its own transactions, some committed and some rolled
back. A rate-limited task drains through a 5/s bucket; two kinds of worker each declare
a per-second schedule of their own; the pruner deletes finished work after 1 s (failed
work after 60 s). The maintenance leader is SIGKILLed once, another worker once.

At the end, once the failed parents' children are old enough to prune, the parents are
retried by a person, and their fan-in must still see every child.

Checked: the invariants (1-9, see ``checker``), on pruned jobs too; no job of a
rolled-back enqueue exists; no schedule misses a tick once one fires (each kind of
worker's schedule included, whoever leads); the rate-limited task never starts faster
than its bucket allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faults import effects
from tests.faults.checker import all_events, missing_ticks, rate_overruns, schedule_ticks
from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.faultapp import retried_marker
from tests.faults.harness import wait_all_done, wait_for
from tether import InvalidJobError, Workflow
from tether.feed import FeedFilter

pytestmark = pytest.mark.slow

RATE, BURST = 5.0, 5
RETENTION = {"succeeded": 1.0, "cancelled": 1.0, "failed": 60.0, "interval": 1.0}
# Two kinds of worker, each declaring its own per-second schedule.
KINDS = {"a": "tick-a", "b": "tick-b"}
WORKERS = {"a0": "a", "a1": "a", "b0": "b"}


class Load:
    """The test's side of the traffic: each call enqueues one kind of work."""

    def __init__(self, s: Scenario, rng: random.Random) -> None:
        self.s = s
        self.rng = rng
        self.parents: list[int] = []
        self.failing: list[int] = []
        self.txns = {"committed": 0, "rolled_back": 0, "refused": 0}
        self.n = 0

    def ms(self) -> int:
        return self.rng.randint(20, 200)

    async def bulk(self, size: int) -> None:
        await self.s.enqueue("work", [{"ms": self.ms()} for _ in range(size)])

    async def parent(self, fail: bool = False) -> None:
        args = {"children": 3, "child_ms": self.rng.randint(20, 60), "fail_fanin": fail}
        [job] = await self.s.enqueue("parent", [args])
        (self.failing if fail else self.parents).append(job)

    async def chain(self) -> None:
        wf = Workflow()
        prev: list[str] = []
        for i in range(self.rng.randint(2, 4)):
            prev = [wf.add(f"n{i}", "work", {"ms": self.ms()}, depends_on=prev)]
        sent = time.time()
        made = await self.s.app.enqueue_workflow(wf)
        self.s.history.add("enqueued", task="chain", ids=[j.id for j in made.values()], sent=sent)

    def running(self) -> int | None:
        # Not a child: a failing parent's cascade reaches everything downstream of it,
        # the dependents of its children included (docs: workflows), and this job
        # must succeed.
        rows = self.s.db.query(
            "SELECT id FROM tether_jobs WHERE state = 'running' AND task = 'work' "
            "AND parent_id IS NULL LIMIT 5"
        )
        return int(self.rng.choice(rows)[0]) if rows else None

    async def after_running(self) -> None:
        """A job that depends on one that is running now."""
        dep = self.running()
        if dep is None:
            return
        with contextlib.suppress(InvalidJobError):  # it was pruned meanwhile
            await self.s.enqueue("work", [{"ms": self.ms()}], depends_on=[dep])

    async def transaction(self, commit: bool, hold: float) -> None:
        """Enqueue two jobs (one depending on a running job) in a transaction of our own,
        hold it ``hold`` seconds, then commit or roll back."""
        self.n += 1
        keys = [f"txn-{self.n}-{i}" for i in range(2)]
        dep = self.running()
        opts: list[dict[str, Any]] = [
            {"idempotency_key": keys[0]},
            {"idempotency_key": keys[1], "depends_on": [dep] if dep else []},
        ]
        sent = time.time()
        try:
            if self.s.sqlite:
                ids = await asyncio.to_thread(self._sqlite_txn, opts, commit, hold)
            else:
                ids = await self._pg_txn(opts, commit, hold)
        except InvalidJobError:
            self.txns["refused"] += 1  # the running job was pruned meanwhile: nothing
            return
        if commit:
            self.txns["committed"] += 1
            self.s.history.add("enqueued", task="work", ids=ids, sent=sent, txn=True)
        else:
            self.txns["rolled_back"] += 1
            self.s.history.add("rolled_back", keys=keys, ids=ids)

    async def _pg_txn(self, opts: list[dict[str, Any]], commit: bool, hold: float) -> list[int]:
        async with await psycopg.AsyncConnection.connect(self.s.url) as conn:
            ids = []
            for o in opts:
                job = await self.s.app.enqueue("work", {"ms": self.ms()}, connection=conn, **o)
                ids.append(job.id)
            await asyncio.sleep(hold)
            if commit:
                await conn.commit()
            else:
                await conn.rollback()
            return ids

    def _sqlite_txn(self, opts: list[dict[str, Any]], commit: bool, hold: float) -> list[int]:
        conn = sqlite3.connect(effects.sqlite_path(self.s.url), timeout=30)
        try:
            ids = []
            for o in opts:
                job = self.s.app.enqueue_sync("work", {"ms": self.ms()}, connection=conn, **o)
                ids.append(job.id)
            time.sleep(hold)  # holding SQLite's write lock: keep it short
            if commit:
                conn.commit()
            else:
                conn.rollback()
            return ids
        finally:
            conn.close()


def leader_name(s: Scenario) -> str | None:
    rows = s.db.query("SELECT holder FROM tether_leaders")
    holder = rows[0][0] if rows else None
    return next((n for n in WORKERS if s.cluster.worker_id(n) == holder), None)


async def _follow(s: Scenario, seen: list[int]) -> None:
    """Follow the live feed until cancelled, counting the transitions in ``seen[0]``."""
    async for _ in await s.app.jobs.feed(FeedFilter(), poll=0.5):
        seen[0] += 1


async def _stop_following(s: Scenario, feed: asyncio.Task[None]) -> None:
    """Stop the feed (which must not have failed), and end its word that it follows
    now rather than when it lapses."""
    feed.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await feed
    if not s.sqlite:
        s.db.query("DELETE FROM tether_listeners WHERE channel = 'tether_feed' RETURNING 1")


async def mixed(s: Scenario, seed: int) -> None:
    p = s.params
    rng = random.Random(seed)
    await s.app.queues.rate_limit(task="paced", per_second=RATE, burst=BURST)
    for name, kind in WORKERS.items():
        s.cluster.start(name, schedules=[{"name": KINDS[kind], "cron": "* * * * * *"}])
    await s.registered(WORKERS)
    s.supervise()
    started = time.time()
    load = Load(s, rng)
    await s.enqueue("paced", [{"ms": 20} for _ in range(p["paced"])])
    for _ in range(p["failing_parents"]):
        await load.parent(fail=True)
    seconds = p["seconds"]
    # SIGKILL the leader at a third of the run, and another worker at two thirds.
    faults = {seconds / 3: "leader", 2 * seconds / 3: "other"}
    kills = []
    # A live feed follows from a quarter of the run to a half, so that on PostgreSQL
    # some jobs store every transition and others only what their row cannot give, and
    # some change over in mid-run (migration 0028): the histories the invariants read
    # must be whole either way.
    feed: asyncio.Task[None] | None = None
    fed = [0]
    actions = [
        (3, lambda: load.bulk(p["bulk_size"])),
        (3, load.parent),
        (2, load.chain),
        (2, load.after_running),
        (1, lambda: load.transaction(True, rng.uniform(0.1, p["txn_hold"]))),
        (1, lambda: load.transaction(False, rng.uniform(0.1, p["txn_hold"]))),
    ]
    weights = [w for w, _ in actions]
    while (elapsed := time.time() - started) < seconds:
        if feed is None and elapsed >= seconds / 4:
            feed = asyncio.create_task(_follow(s, fed))
        elif feed is not None and not feed.done() and elapsed >= seconds / 2:
            await _stop_following(s, feed)
        for at, which in list(faults.items()):
            if elapsed >= at:
                del faults[at]
                leader = leader_name(s)
                victim = (
                    leader
                    if which == "leader"
                    else rng.choice([n for n in s.cluster.alive() if n != leader] or [None])
                )
                if victim is not None:
                    held = s.db.running_of_worker(s.cluster.worker_id(victim))
                    kills.append(s.history.add("kill", name=victim, held=held, leader=which))
                    s.cluster.signal(victim, signal.SIGKILL)
        [act] = rng.choices([a for _, a in actions], weights)
        await act()
        await asyncio.sleep(rng.uniform(0.1, 0.4))
    load_ended = time.time()
    if feed is not None and not feed.done():
        await _stop_following(s, feed)

    # The failed parents' children are now old enough to prune; retry the parents.
    await wait_for(lambda: set(s.db.states(load.failing).values()) <= {"failed"}, 60)
    await asyncio.sleep(RETENTION["succeeded"] + 2 * RETENTION["interval"] + 1)
    for job in load.failing:
        await asyncio.to_thread(Path(retried_marker(job, s.run_dir)).touch)
        await s.app.jobs.retry(job)
    s.history.add("retried", ids=load.failing)
    paused_at = time.time()
    for name in KINDS.values():
        with contextlib.suppress(Exception):  # a schedule no leader has seen yet
            await s.app.schedules.pause(name)
    await asyncio.sleep(1.5)  # a tick taken just before the pause
    with contextlib.suppress(AssertionError):  # a stuck job fails the check below
        await wait_all_done(s.db, timeout=p["drain_timeout"])
    await s.unsupervise()
    codes = await s.cluster.stop_all()

    verdict = s.check(must_succeed=s.history.acked())
    ticks = schedule_ticks(s.db)
    # From shortly after the first tick of any schedule (one job per tick, whoever leads
    # and whichever worker declared it) until shortly before the pause.
    window = (min((t[0] for t in ticks.values()), default=paused_at) + 2.0, paused_at - 2.0)
    gaps = {name: missing_ticks(ticks.get(name, []), *window) for name in KINDS.values()}
    paced_ids = {i for op in s.history.of("enqueued") if op["task"] == "paced" for i in op["ids"]}
    paced = [e["at"] for e in all_events(s.db) if e["dst"] == "running" and e["job"] in paced_ids]
    overruns = rate_overruns(paced, RATE, BURST)
    worst = max(overruns, key=lambda o: o[0] - RATE * o[1], default=None)
    s.figures = {
        "jobs": verdict.figures["jobs"],
        "acked": verdict.figures["acked"],
        "parents": len(load.parents) + len(load.failing),
        "retried_parents": len(load.failing),
        "txn_committed": load.txns["committed"],
        "txn_rolled_back": load.txns["rolled_back"],
        "kills": len(kills),
        "restarts": s.cluster.restarts,
        "pruned": verdict.figures["pruned"],
        "stuck_parents": verdict.figures["stuck_parents"],
        "stuck_dependents": verdict.figures["stuck_dependents"],
        "out_of_order": verdict.figures["out_of_order"],
        **{f"ticks_{n}": len(ticks.get(n, [])) for n in KINDS.values()},
        **{f"missed_{n}": len(g) for n, g in gaps.items()},
        "feed_transitions": fed[0],
        "paced_claims": len(paced),
        "rate_overruns": len(overruns),
        "bucket_steps_back": verdict.figures["bucket_steps_back"],
        "worst_overrun": f"{worst[0]} in {worst[1]:.3f}s" if worst else None,
        "lease_losses": verdict.figures["lease_losses"],
        "overlaps": verdict.figures["overlaps"],
        "reruns": verdict.figures["reruns"],
        "stale_rejected": verdict.figures["stale_rejected"],
        "load_s": load_ended - started,
        "violations": len(verdict.violations),
    }
    problems = list(verdict.violations)
    for name, gap in gaps.items():
        if gap or not ticks.get(name):
            problems.append(
                f"schedule {name}: {len(ticks.get(name, []))} ticks fired, {len(gap)} missed "
                f"in the {window[1] - window[0]:.1f}s window, e.g. {gap[:5]}"
            )
    if overruns:
        problems.append(
            f"rate limit {RATE:g}/s burst {BURST}: {len(overruns)} windows overran, worst {worst}"
        )
    if any(c != 0 for c in codes.values()):
        problems.append(f"workers did not stop cleanly: {codes}")
    assert not problems, f"{len(problems)} problem(s) in {s.run_dir}:\n" + "\n".join(problems[:40])


async def test_mixed_workload(scenario: MakeScenario) -> None:
    s = await scenario("mixed", retention=RETENTION)
    await mixed(s, seed=21)


async def test_sqlite_mixed_workload(scenario: MakeScenario) -> None:
    s = await scenario("sqlite_mixed", store="sqlite", retention=RETENTION)
    await mixed(s, seed=22)
