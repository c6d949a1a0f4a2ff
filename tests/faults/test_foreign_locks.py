"""Scenario 15 (and 15a on SQLite): rows held by someone else's transaction.

Any client may hold any row for as long as it likes: a caller's transaction around a
transactional enqueue, an operator's ``SELECT ... FOR UPDATE`` in psql. While work flows
through three workers (plain, rate-limited, pooled and keyed jobs, workflows with
children and dependency chains, a per-second schedule, pruning after 2 s), an outside
transaction on a connection of its own holds one random row after another:

- PostgreSQL: a job (running, queued or blocked), a limit (``tether_limits``), a rate
  bucket (``tether_rate_limits``) or a schedule (``tether_schedules``), ``FOR UPDATE``,
  ``FOR SHARE`` or ``FOR KEY SHARE``, for up to ``max_hold`` seconds each. In each kill
  round it holds a running job of one worker and SIGKILLs that worker just after.
- SQLite (the analogue: a file has one write lock, no row locks): long read
  transactions (WAL readers block no writer) for up to ``max_hold`` seconds, and the
  write lock (``BEGIN IMMEDIATE``) for less than the workers' fence time. One hold of
  the write lock lasts two leases: every heartbeat stops, the workers fence
  themselves, and the check is that fencing keeps the invariants (leases lost then are
  expected).

Checked: every invariant; the rescue of the killed worker's *other* jobs (rows not held)
takes less than three times its usual bound; no job whose row was not held loses its
lease (a ``lease_lost`` stop, or a rescue from a live worker), outside SQLite's
stop-the-world hold; the rate-limited task never starts faster than its bucket allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sqlite3
import time
from typing import Any

import psycopg
import pytest

from tests.faults import effects
from tests.faults.checker import LeaseLoss, all_events, missing_ticks, rate_overruns, schedule_ticks
from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.faultapp import BASE_CONFIG
from tests.faults.harness import percentiles, wait_all_done, wait_for
from tether import InvalidJobError, Workflow

pytestmark = pytest.mark.slow

LEASE = float(BASE_CONFIG["lease_duration"])
FENCE = LEASE - float(BASE_CONFIG["self_fence_margin"])
# A SIGKILLed worker's job is rescued at the next rescue pass (0.25 s apart) that sees
# its pid gone (same PID namespace): under load that took up to 1.34 s (multihost,
# REPORT.md). The bound asserted with rows held is three times that.
NORMAL_RESCUE = 1.5
RESCUE_BOUND = 3 * NORMAL_RESCUE
RATE, BURST = 5.0, 5
RETENTION = {"succeeded": 2.0, "cancelled": 2.0, "failed": 60.0, "interval": 1.0}
WORKERS = ("w0", "w1", "w2")
MODES = ("FOR UPDATE", "FOR SHARE", "FOR KEY SHARE")
# kind: (table, key column, condition)
PG_ROWS = {
    "running job": ("tether_jobs", "id", "state = 'running'"),
    "queued job": ("tether_jobs", "id", "state IN ('queued', 'retrying')"),
    "blocked job": ("tether_jobs", "id", "state = 'blocked'"),
    "limit": ("tether_limits", "name", "true"),
    "rate bucket": ("tether_rate_limits", "id", "true"),
    "schedule": ("tether_schedules", "name", "true"),
}
SQLITE_TABLES = ("tether_jobs", "tether_limits", "tether_rate_limits", "tether_schedules")


class Holder:
    """The outside client: holds rows (PostgreSQL) or locks (SQLite) on a connection
    of its own, each hold recorded in the history (``hold``, with its end)."""

    def __init__(self, s: Scenario, rng: random.Random) -> None:
        self.s = s
        self.rng = rng
        self.held_jobs: set[int] = set()
        self.writing = asyncio.Lock()
        self.write_free = 0.0

    async def hold_pg(
        self, kind: str, seconds: float, row: Any = None, mode: str | None = None
    ) -> dict[str, Any] | None:
        table, col, where = PG_ROWS[kind]
        mode = mode or self.rng.choice(MODES)
        async with await psycopg.AsyncConnection.connect(self.s.url) as conn:
            if row is None:
                cur = await conn.execute(
                    f"SELECT {col} FROM {table} WHERE {where} ORDER BY random() LIMIT 1"  # type: ignore[arg-type]
                )
                found = await cur.fetchone()
                await conn.rollback()
                if found is None:
                    return None
                row = found[0]
            if table == "tether_jobs":
                self.held_jobs.add(int(row))
            await conn.execute(
                f"SELECT 1 FROM {table} WHERE {col} = %s {mode}",  # type: ignore[arg-type]
                (row,),
            )
            op = self.s.history.add("hold", what=kind, row=row, mode=mode, seconds=seconds)
            await asyncio.sleep(seconds)
            await conn.rollback()
            op["end"] = time.time()
            return op

    async def hold_sqlite(self, write: bool, seconds: float) -> dict[str, Any]:
        def hold() -> dict[str, Any]:
            conn = sqlite3.connect(
                effects.sqlite_path(self.s.url), timeout=30, isolation_level=None
            )
            try:
                table = self.rng.choice(SQLITE_TABLES)
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                conn.execute(f"SELECT COUNT(*) FROM {table}").fetchall()
                kind = "write lock" if write else f"read of {table}"
                op = self.s.history.add("hold", what=kind, seconds=seconds)
                time.sleep(seconds)
                conn.execute("ROLLBACK")
                op["end"] = time.time()
                return op
            finally:
                conn.close()

        return await asyncio.to_thread(hold)

    async def random_holds(self, max_hold: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            seconds = self.rng.uniform(0.5, max_hold)
            if self.s.sqlite:
                write = self.rng.random() < 0.5
                if write:
                    # The write lock stops every writer: hold it for less than half the
                    # fence time, never two holds back to back (several holders run).
                    async with self.writing:
                        await asyncio.sleep(max(0.0, self.write_free - time.time()))
                        await self.hold_sqlite(True, min(seconds, FENCE / 2 - 0.1))
                        self.write_free = time.time() + FENCE / 2
                else:
                    await self.hold_sqlite(False, seconds)
            else:
                await self.hold_pg(self.rng.choice(list(PG_ROWS)), seconds)
            await asyncio.sleep(self.rng.uniform(0.1, 0.5))


async def produce(s: Scenario, rng: random.Random, stop: asyncio.Event) -> None:
    """Every kind of job, at about half the workers' capacity."""
    n = 0
    while not stop.is_set():
        n += 1
        pick = rng.randrange(6)
        if pick == 0:
            await s.enqueue("work", [{"ms": rng.randint(300, 1500)} for _ in range(4)])
        elif pick == 1:
            await s.enqueue("paced", [{"ms": 50} for _ in range(3)])
        elif pick == 2:
            await s.enqueue("pooled", [{"ms": rng.randint(100, 300)} for _ in range(2)])
        elif pick == 3:
            await s.enqueue("work", [{"ms": 150}], key=f"k{rng.randrange(3)}")
        elif pick == 4:
            await s.enqueue("parent", [{"children": 3, "child_ms": rng.randint(50, 150)}])
        else:
            wf = Workflow()
            prev: list[str] = []
            for i in range(3):
                prev = [wf.add(f"n{i}", "work", {"ms": rng.randint(50, 200)}, depends_on=prev)]
            with contextlib.suppress(InvalidJobError):
                made = await s.app.enqueue_workflow(wf)
                s.history.add("enqueued", task="chain", ids=[j.id for j in made.values()])
        await asyncio.sleep(rng.uniform(0.2, 0.6))


async def kill_round(s: Scenario, holder: Holder, hold: float) -> dict[str, Any] | None:
    """Hold one running job of a worker that runs at least two, then SIGKILL that worker:
    its other jobs must still be rescued promptly."""

    def victim() -> tuple[str, list[tuple[int, int]]] | None:
        for name in s.cluster.alive():
            running = s.db.running_of(s.cluster.pid(name))
            if len(running) >= 2:
                return name, running
        return None

    found = await wait_for(victim, 30, every=0.1)
    name, running = found
    target = running[0][0]
    task = asyncio.create_task(
        holder.hold_pg("running job", hold, row=target, mode=holder.rng.choice(MODES))
        if not s.sqlite
        else holder.hold_sqlite(False, hold)
    )
    await asyncio.sleep(0.3)
    others = [r for r in s.db.running_of(s.cluster.pid(name)) if r[0] != target]
    kill = s.history.add("kill", name=name, held=others, row_held=target)
    s.cluster.signal(name, signal.SIGKILL)
    await watch_freed(s, kill, hold + 10.0)
    await task
    return kill


async def live_round(s: Scenario, holder: Holder, hold: float) -> None:
    """Hold (``FOR SHARE`` or ``FOR UPDATE``, which a heartbeat's update waits for) one
    running job of a live worker that runs others too: they must keep their leases."""

    def busy() -> int | None:
        for name in s.cluster.alive():
            running = s.db.running_of(s.cluster.pid(name))
            if len(running) >= 2:
                return running[0][0]
        return None

    target = await wait_for(busy, 30, every=0.1)
    mode = holder.rng.choice(MODES[:2])
    await holder.hold_pg("running job", hold, row=target, mode=mode)


async def watch_freed(s: Scenario, kill: dict[str, Any], timeout: float) -> None:
    """Poll until each job the killed worker held (``kill["held"]``) is no longer running
    under its old lease; ``kill["freed"]`` gets the seconds each took. Measured here, not
    from the rescue's event, whose time is its transaction's start (before any wait)."""
    left = {int(job): int(token) for job, token in kill["held"]}
    freed: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        marks = ",".join(map(str, left))
        rows = s.db.query(f"SELECT id, state, lease_token FROM tether_jobs WHERE id IN ({marks})")
        now = time.time()
        still = {int(r[0]) for r in rows if r[1] == "running" and int(r[2]) == left[int(r[0])]}
        for job in list(left):
            if job not in still:
                freed[job] = now - kill["t"]
                del left[job]
        await asyncio.sleep(0.05)
    kill["freed"] = freed
    kill["not_freed"] = sorted(left)


async def foreign_locks(s: Scenario, seed: int) -> None:
    p = s.params
    rng = random.Random(seed)
    await s.app.queues.rate_limit(task="paced", per_second=RATE, burst=BURST)
    for k in range(3):
        await s.app.queues.configure_key(f"k{k}", max_running=1)
    for name in WORKERS:
        s.cluster.start(name, schedules=[{"name": "tick", "cron": "* * * * * *"}])
    await s.registered(WORKERS)
    s.supervise()
    started = time.time()
    holder = Holder(s, rng)
    stop = asyncio.Event()
    producer = asyncio.create_task(produce(s, rng, stop))
    await asyncio.sleep(2.0)  # some work running, the schedule's row written
    # A kill without a held row first: the usual delay, for the report.
    base = await kill_round_unheld(s)
    holds = [
        asyncio.create_task(holder.random_holds(p["max_hold"], stop)) for _ in range(p["holders"])
    ]
    kills = []
    stw = None
    for i in range(p["kill_rounds"]):
        kill = await kill_round(s, holder, p["kill_hold"])
        if kill is not None:
            kills.append(kill)
        if not s.sqlite and i < p["live_rounds"]:
            await live_round(s, holder, p["kill_hold"])
        if s.sqlite and i == 0:
            # Stop the world once: the write lock for two leases.
            stw = await holder.hold_sqlite(True, 2 * LEASE)
    await asyncio.sleep(max(0.0, p["seconds"] - (time.time() - started)))
    stop.set()
    await producer
    await asyncio.gather(*holds)
    paused_at = time.time()
    with contextlib.suppress(Exception):
        await s.app.schedules.pause("tick")
    await asyncio.sleep(1.5)
    with contextlib.suppress(AssertionError):  # a stuck job fails the check below
        await wait_all_done(s.db, timeout=p["drain_timeout"])
    await s.unsupervise()
    codes = await s.cluster.stop_all()

    verdict = s.check(must_succeed=s.history.acked())
    events = all_events(s.db)
    freed = [t for k in kills for t in k["freed"].values()]
    not_freed = [j for k in kills for j in k["not_freed"]]
    freed_base = list(base["freed"].values()) if base else []
    unrelated = [
        loss
        for loss in verdict.lease_losses
        if loss.job not in holder.held_jobs and not during(stw, loss)
    ]
    paced_ids = {i for op in s.history.of("enqueued") if op["task"] == "paced" for i in op["ids"]}
    paced = [e["at"] for e in events if e["dst"] == "running" and e["job"] in paced_ids]
    overruns = rate_overruns(paced, RATE, BURST)
    worst = max(overruns, key=lambda o: o[0] - RATE * o[1], default=None)
    ticks = schedule_ticks(s.db).get("tick", [])
    missed = missing_ticks(ticks, ticks[0], paused_at - 2.0) if ticks else []
    hold_ops = s.history.of("hold")
    pct, pct_base = percentiles(freed), percentiles(freed_base)
    s.figures = {
        "jobs": verdict.figures["jobs"],
        "holds": len(hold_ops),
        "held_s_max": max((op["seconds"] for op in hold_ops), default=None),
        "held_jobs": len(holder.held_jobs),
        "kills": len(kills) + (1 if base else 0),
        "rescue_unheld_max": pct_base["max"],
        "rescue_others_p50": pct["p50"],
        "rescue_others_max": pct["max"],
        "rescue_others_n": len(freed),
        "rescue_bound": RESCUE_BOUND,
        "unrelated_lease_losses": len(unrelated),
        "lease_losses": len(verdict.lease_losses),
        "paced_claims": len(paced),
        "rate_overruns": len(overruns),
        "bucket_steps_back": verdict.figures["bucket_steps_back"],
        "worst_overrun": f"{worst[0]} in {worst[1]:.3f}s" if worst else None,
        "ticks": len(ticks),
        "missed_ticks": len(missed),
        "pruned": verdict.figures["pruned"],
        "stuck_parents": verdict.figures["stuck_parents"],
        "overlaps": verdict.figures["overlaps"],
        "live_rescues": verdict.figures["live_rescues"],
        "reruns": verdict.figures["reruns"],
        "stale_rejected": verdict.figures["stale_rejected"],
        "violations": len(verdict.violations),
    }
    problems = list(verdict.violations)
    slow = [t for t in freed if t >= RESCUE_BOUND]
    if slow or not_freed or not freed:
        problems.append(
            f"rescue of the killed workers' other jobs: {len(freed)} freed, "
            f"{len(slow)} took >= {RESCUE_BOUND}s (max {pct['max']}), {len(not_freed)} not "
            f"freed within the hold + 10s; with no row held: max {pct_base['max']}"
        )
    for loss in unrelated[:20]:
        problems.append(f"unrelated lease lost: job {loss.job} on {loss.proc} ({loss.how})")
    if overruns:
        problems.append(
            f"rate limit {RATE:g}/s burst {BURST}: {len(overruns)} windows overran, worst {worst}"
        )
    if any(c != 0 for c in codes.values()):
        problems.append(f"workers did not stop cleanly: {codes}")
    assert not problems, f"{len(problems)} problem(s) in {s.run_dir}:\n" + "\n".join(problems[:40])


def during(hold: dict[str, Any] | None, loss: LeaseLoss) -> bool:
    """Whether a lease was lost because of SQLite's stop-the-world hold (from its start
    until a lease after its end)."""
    return hold is not None and hold["t"] <= loss.t <= hold["end"] + LEASE


async def kill_round_unheld(s: Scenario) -> dict[str, Any] | None:
    """SIGKILL a worker that runs something, with no row held: the usual delay."""

    def victim() -> tuple[str, list[tuple[int, int]]] | None:
        for name in s.cluster.alive():
            running = s.db.running_of(s.cluster.pid(name))
            if running:
                return name, running
        return None

    name, running = await wait_for(victim, 30, every=0.1)
    kill = s.history.add("kill", name=name, held=running)
    s.cluster.signal(name, signal.SIGKILL)
    await watch_freed(s, kill, 3 * LEASE)
    return kill


async def test_foreign_locks(scenario: MakeScenario) -> None:
    s = await scenario("foreign_locks", retention=RETENTION)
    await foreign_locks(s, seed=31)


async def test_sqlite_foreign_locks(scenario: MakeScenario) -> None:
    s = await scenario("sqlite_foreign_locks", store="sqlite", retention=RETENTION)
    await foreign_locks(s, seed=32)
