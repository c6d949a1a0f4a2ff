"""Scenario 17 (and 17a on SQLite): durable steps under SIGKILLs and zombies.

Jobs of the ``durable`` task run five steps each; every step inserts a row into
``fault_step_effects`` in a fenced transaction (``ctx.transaction()``) that commits with
the step's record only while the attempt holds the lease. On PostgreSQL the transaction
stays open while the step works, so a worker stopped mid-step holds an uncommitted
write; on SQLite (where it holds the write lock) it opens at the step's end.

While the jobs run, workers holding jobs with steps done are SIGKILLed mid-step (and
restarted), and workers in a step just begun are SIGSTOPped for twice their lease,
then SIGCONTed (neither fault hits the maintenance leader). Once a zombie's job runs
again elsewhere, the test sends the zombie's step commit itself, with its stale token,
and it must be refused; the zombie wakes with its step unfinished, and its own commit
must be refused too.

- Every job succeeds, each step completed once (invariant 11): a later attempt replays
  the steps an earlier one completed and runs only the rest.
- Each step's fenced write committed exactly once, by the attempt its record names
  (invariant 12): a killed attempt's write rolled back, a zombie's was refused (or
  rolled back when it fenced itself). A zombie whose job nobody had taken yet (the
  leader was being replaced, say) still holds the lease's token, and commits as its
  holder: ``zombie_effects_committed``, never a second write.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import random
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faults import effects
from tests.faults.conftest import MakeScenario, Scenario
from tests.faults.faultapp import BASE_CONFIG
from tests.faults.harness import read_exec_log, wait_all_done, wait_for
from tether import LeaseLostError
from tether.durable import FencedConnection

pytestmark = pytest.mark.slow

LEASE = float(BASE_CONFIG["lease_duration"])
FREEZE = 2 * LEASE  # past the lease: the job is leased again while the zombie sleeps


async def produce(s: Scenario, rng: random.Random, hold: bool) -> None:
    """Enqueue the jobs in batches spread over the run, each batch acknowledged."""
    p = s.params
    left = p["jobs"]
    batch = max(1, p["jobs"] // max(1, int(p["seconds"] / 0.25)))
    while left > 0:
        size = min(batch, left)
        args = [{"steps": p["steps"], "ms": rng.randint(*p["ms"]), "hold": hold}]
        await s.enqueue("durable", args * size)
        left -= size
        await asyncio.sleep(0.25)


class Progress:
    """The jobs' progress, read off the execution logs as they grow: per (job, token),
    the steps that attempt completed (ran, or replayed), and when each step now under
    way began."""

    def __init__(self, s: Scenario) -> None:
        self.dir = s.run_dir / "exec"
        self.offsets: dict[Path, int] = {}
        self.done: collections.Counter[tuple[int, int]] = collections.Counter()
        self.begun: dict[tuple[int, int, str], float] = {}
        self.attempt: dict[tuple[int, int], int] = {}

    def read(self) -> None:
        for path in self.dir.glob("exec-*.log"):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # a line still being written is read next time
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in chunk[:end].splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e["ev"] in ("step_done", "step_replay"):
                    self.done[(e["job"], e["token"])] += 1
                    self.begun.pop((e["job"], e["token"], e["step"]), None)
                elif e["ev"] == "step_start":
                    self.begun[(e["job"], e["token"], e["step"])] = e["t"]
                    self.attempt[(e["job"], e["token"])] = e["attempt"]

    def under_way(self, held: list[tuple[int, int]]) -> list[tuple[int, int, int, str]]:
        """(job, token, attempt, step) of each of these attempts now in a step."""
        return [
            (job, token, self.attempt[(job, token)], step)
            for job, token, step in self.begun
            if (job, token) in held
        ]

    def fresh(self, within: float = 0.04) -> set[tuple[int, int]]:
        """The attempts in a step begun in the last ``within`` seconds (with time left)."""
        now = time.time()
        return {(job, token) for (job, token, _), t in self.begun.items() if now - t < within}


def leader(s: Scenario) -> str | None:
    rows = s.db.query("SELECT holder FROM tether_leaders")
    holder = rows[0][0] if rows else None
    return next((n for n in s.cluster.procs if s.cluster.worker_id(n) == holder), None)


def victim(
    s: Scenario,
    seen: Progress,
    frozen: set[str],
    *,
    spare: str | None = None,
    mid_step: bool = False,
) -> tuple[str, list[tuple[int, int]], int] | None:
    """A live, unfrozen worker (not ``spare``) holding jobs, preferably ones past their
    first step (with ``mid_step``, only one with a step just begun): (name,
    [(job, token)], steps its held attempts completed)."""
    seen.read()
    done, fresh = seen.done, seen.fresh()
    best = None
    for name in s.cluster.alive():
        if name in frozen or name == spare:
            continue
        held = s.db.running_of_worker(s.cluster.worker_id(name))
        if not held or (mid_step and not fresh.intersection(held)):
            continue
        n = sum(done[(job, token)] for job, token in held)
        if best is None or n > best[2]:
            best = (name, held, n)
    return best


async def freeze(
    s: Scenario,
    name: str,
    frozen: set[str],
    in_step: list[tuple[int, int, int, str]],
    replays: collections.Counter[str],
) -> None:
    """Freeze ``name`` past its lease. Once a job it was in a step of runs again
    elsewhere, the test sends the zombie's step commit itself, with its stale token
    (:func:`replay_commit`): it must be refused."""
    frozen.add(name)
    pid = s.cluster.pid(name)
    try:
        s.cluster.signal(name, signal.SIGSTOP)
        until = time.monotonic() + FREEZE
        left = list(in_step)
        while left and time.monotonic() < until - 0.5:
            await asyncio.sleep(0.1)
            for zombie in list(left):
                job, token, attempt, step = zombie
                rows = s.db.query(
                    "SELECT 1 FROM tether_jobs WHERE id = %s AND state = 'running' "
                    "AND lease_token > %s",
                    (job, token),
                )
                if rows:
                    left.remove(zombie)
                    ok = await replay_commit(s, job, token, attempt, step, pid)
                    replays["accepted" if ok else "refused"] += 1
                    s.history.add("replayed_step", job=job, token=token, step=step, ok=ok)
        await asyncio.sleep(max(0.0, until - time.monotonic()))
    finally:
        s.cluster.signal(name, signal.SIGCONT)
        frozen.discard(name)


async def replay_commit(
    s: Scenario, job_id: int, token: int, attempt: int, step: str, pid: int
) -> bool:
    """What the zombie would do on waking, done by the test while its job runs again:
    write its step's row in a fenced transaction and commit it with the step's record,
    under its stale token. True if that committed."""
    job = dataclasses.replace(await s.app.get(job_id), lease_token=token)
    row = (job_id, step, attempt, token, pid, time.time())
    insert = (
        "INSERT INTO fault_step_effects (job_id, step, attempt, lease_token, pid, at) "
        "VALUES (%s, %s, %s, %s, %s, %s)"
    )
    conn: Any
    if s.sqlite:
        conn = sqlite3.connect(effects.sqlite_path(s.url), timeout=30, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(insert.replace("%s", "?"), row)
    else:
        conn = await psycopg.AsyncConnection.connect(s.url)
        await conn.execute(insert, row)
    fenced = FencedConnection(conn, s.url, job)
    try:
        await fenced.commit(step, "null")
    except LeaseLostError:
        return False
    finally:
        await fenced.close()
    return True


def zombie_writes(s: Scenario, committed: set[tuple[int, str, int]]) -> tuple[int, int]:
    """Step writes of attempts frozen mid-step (the step not completed before the
    SIGSTOP): (those that never committed: refused at the zombie's commit or rolled
    back when it fenced itself; those that committed: nobody had leased the job while
    it slept)."""
    execs = read_exec_log(s.run_dir)
    stops = collections.defaultdict(list)
    for op in s.history.of("signal"):
        if op["sig"] == "SIGSTOP":
            stops[op["proc"]].append(op["t"])
    began = {(e["job"], e["token"], e["proc"]): e["t"] for e in execs if e["ev"] == "start"}
    ended = {(e["job"], e["token"], e["proc"]): e["t"] for e in execs if e["ev"] == "end"}
    done = {(e["job"], e["token"], e["step"]): e["t"] for e in execs if e["ev"] == "step_done"}
    refused = accepted = 0
    for e in execs:
        if e["ev"] != "step_write":
            continue
        key = (e["job"], e["token"], e["proc"])
        start, end = began.get(key, 0.0), ended.get(key, float("inf"))
        finished = done.get((e["job"], e["token"], e["step"]), float("inf"))
        if any(start < t < min(end, finished) for t in stops.get(e["proc"], [])):
            if (e["job"], e["step"], e["token"]) in committed:
                accepted += 1
            else:
                refused += 1
    return refused, accepted


async def durable(s: Scenario, seed: int, *, hold: bool) -> None:
    p = s.params
    rng = random.Random(seed)
    s.cluster.config.update(concurrency=p["concurrency"], claim_batch=p["concurrency"])
    names = [f"w{i}" for i in range(p["workers"])]
    for name in names:
        s.cluster.start(name)
    await s.registered(names)
    s.supervise()
    producer = asyncio.create_task(produce(s, rng, hold))
    faults = ["kill"] * p["kills"] + ["freeze"] * p["freezes"]
    rng.shuffle(faults)
    gap = p["seconds"] / (len(faults) + 1)
    frozen: set[str] = set()
    seen = Progress(s)
    replays: collections.Counter[str] = collections.Counter()
    thaws: list[asyncio.Task[None]] = []
    kills = freezes = replay_kills = 0
    for fault in faults:
        await asyncio.sleep(rng.uniform(0.6 * gap, 1.4 * gap))
        if fault == "freeze":
            await asyncio.gather(*thaws)  # one zombie at a time: the others carry on
        # A zombie is stopped in a step just begun (on PostgreSQL with its write
        # uncommitted). No fault hits the maintenance leader, so that a job is leased
        # again within a lease of its fault (the leader's own failover is the storm's and
        # the mixed scenario's business): what a zombie commits when it wakes is then a
        # stale attempt's.
        zombie = fault == "freeze"
        spare = leader(s)
        try:
            name, held, done = await wait_for(
                lambda spare=spare, zombie=zombie: victim(
                    s, seen, frozen, spare=spare, mid_step=zombie
                ),
                8,
                every=0.02,
            )
        except AssertionError:
            continue  # nothing running to disturb
        if fault == "kill":
            s.history.add("kill", name=name, pid=s.cluster.pid(name), held=held, steps=done)
            s.cluster.signal(name, signal.SIGKILL)
            kills += 1
            replay_kills += done > 0
        else:
            in_step = seen.under_way(held)
            s.history.add("freeze", name=name, held=held, steps=done, in_step=in_step)
            thaws.append(asyncio.create_task(freeze(s, name, frozen, in_step, replays)))
            freezes += 1
    await producer
    await asyncio.gather(*thaws)
    await wait_all_done(s.db, timeout=60 + p["jobs"] * 0.1)
    await asyncio.sleep(0.5)  # the supervisor restarts the last victim
    await s.unsupervise()
    codes = await s.cluster.stop_all()
    assert all(c == 0 for c in codes.values()), f"workers did not stop cleanly: {codes}"

    if s.sqlite:
        check = s.db.query("PRAGMA integrity_check")
        assert [r[0] for r in check] == ["ok"], check
    verdict = s.assert_invariants(must_succeed=s.history.acked())
    f = verdict.figures
    committed = {
        (int(j), str(n), int(t))
        for j, n, t in s.db.query("SELECT job_id, step, lease_token FROM fault_step_effects")
    }
    refused, accepted = zombie_writes(s, committed)
    results = s.db.query("SELECT DISTINCT result FROM tether_jobs WHERE task = 'durable'")
    s.figures = {
        "jobs": f["jobs"],
        "kills": kills,
        "freezes": freezes,
        "restarts": s.cluster.restarts,
        "steps": f["steps"],
        "steps_replayed": f["steps_replayed"],
        "effects": f["step_effects"],
        "writes_uncommitted": f["step_writes_uncommitted"],
        "replayed_step_commits_refused": replays["refused"],
        "zombie_effects_refused": refused,
        "zombie_effects_committed": accepted,  # unleased while it slept
        "executions": f["executions"],
        "reruns": f["reruns"],
        "overlaps": f["overlaps"],
        "live_rescues": f["live_rescues"],
    }
    assert f["acked"] == f["jobs"] == p["jobs"], s.figures
    # The zombie's step commit, replayed with its stale token, was refused every time.
    assert replays["accepted"] == 0, s.figures
    # Every step of every job completed once, with its one write (invariants 11, 12).
    assert f["steps"] == f["step_effects"] == p["jobs"] * p["steps"], s.figures
    assert len(results) == 1, results  # each job's result: [0, 1, 2, 3, 4]
    if replay_kills:
        # A job killed after a completed step replayed it on its next attempt.
        assert f["steps_replayed"] > 0, s.figures


async def test_durable_steps(scenario: MakeScenario) -> None:
    s = await scenario("durable")
    await durable(s, seed=14, hold=True)


async def test_sqlite_durable_steps(scenario: MakeScenario) -> None:
    s = await scenario("sqlite_durable", store="sqlite")
    await durable(s, seed=15, hold=False)
