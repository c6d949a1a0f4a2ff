"""Every pair of store operations, run at once: the result is one of the two serial orders.

Each operation acts on a small world of jobs built afresh for each run: a running job,
a parent waiting for two running children, a queued, a failed, a paused, a zombie and
an old finished job, and an open cancellation record. For each unordered pair of
operations (an operation with itself included: two settlers of one record, two
enqueues of one idempotency key, two sibling completions):

- PostgreSQL: the two run at once, each in its own transaction on its own connection,
  and commit at the same moment (:func:`.concurrency.commit_together`); the end state
  (every job's state and flags, the cancellation records, the paused queues) must equal
  that of running them one after the other in one order or the other;
- SQLite (one writer at a time, so no two write transactions are open together): both
  serial orders run; interleavings of SQLite's write steps are left to the commit-step
  scheduler.

After every run no job may wait on something that has already happened.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from itertools import combinations_with_replacement
from typing import Any

import pytest

from tether.job import Beat, Finished, Job
from tether.states import JobState
from tether.store import Store, create_store

from .concurrency import Barrier, stuck_jobs
from .support import KEPT_TABLES, Db, new_job, outcome, running_job

CANCELLATION = "pair-cancel"


@dataclass
class World:
    """The jobs the operations act on, by role."""

    jobs: dict[str, Job]

    def __getitem__(self, role: str) -> Job:
        return self.jobs[role]


async def build_world(store: Store, db: Db) -> World:
    jobs: dict[str, Job] = {}
    jobs["run"] = await running_job(store, "wa", queue="run")
    parent = await running_job(store, "wp", task="parent", queue="par")
    for _ in range(2):
        assert await store.spawn(parent.id, parent.lease_token, new_job("child", "kids"))
    assert await store.finish("wp", [outcome(parent, JobState.BLOCKED, phase="fanin")])
    jobs["parent"] = parent
    jobs["k1"], jobs["k2"] = await store.claim("wk", ["kids"], ["child"], 2, 60.0)
    jobs["failed"] = await running_job(store, "wf", queue="fq")
    jobs["zombie"] = await running_job(store, "wz", queue="zq")
    jobs["old"] = await running_job(store, "wo", queue="oq")
    assert await store.finish(
        "w",
        [
            outcome(jobs["failed"], JobState.FAILED, error="boom"),
            outcome(jobs["old"], JobState.SUCCEEDED),
        ],
    )
    queued, paused = await store.enqueue([new_job(queue="work"), new_job(queue="pq")])
    jobs["queued"], jobs["paused"] = queued, paused
    await store.request_pause(jobs["paused"].id, None, "setup")
    db.expire_lease(jobs["zombie"].id)
    db.set_ago("tether_jobs", "finished_at", jobs["old"].id, 7200)
    await store.create_cancellation(
        CANCELLATION,
        job_id=jobs["run"].id,
        request_id=None,
        reason=None,
        force=False,
        cascade=True,
        initiated_by="t",
    )
    return World(jobs)


Op = Callable[[Store, World, int], Awaitable[Any]]


def _made(task: str, slot: int, **fields: Any) -> Any:
    return new_job(task, "made", args={"slot": slot}, **fields)


OPS: dict[str, Op] = {
    "enqueue": lambda s, w, n: s.enqueue([_made("plain", n)]),
    "enqueue_dependent": lambda s, w, n: s.enqueue([_made("dep", n, depends_on=(w["run"].id,))]),
    "enqueue_key": lambda s, w, n: s.enqueue([_made("keyed", n, idempotency_key="k1")]),
    "spawn": lambda s, w, n: s.spawn(
        w["run"].id, w["run"].lease_token, new_job("spawned", "sp", args={"slot": n})
    ),
    "claim": lambda s, w, n: s.claim(f"wc{n}", ["work"], ["t"], 1, 60.0),
    "heartbeat": lambda s, w, n: s.heartbeat("wa", [Beat(w["run"].id, w["run"].lease_token)], 60.0),
    # Slot 0 finishes one child, slot 1 its sibling: with itself, two sibling completions.
    "finish_child": lambda s, w, n: s.finish(
        "wk", [outcome(w["k2" if n else "k1"], JobState.SUCCEEDED)]
    ),
    "finish_succeeded": lambda s, w, n: s.finish("wa", [outcome(w["run"], JobState.SUCCEEDED)]),
    "finish_failed": lambda s, w, n: s.finish(
        "wa", [outcome(w["run"], JobState.FAILED, error="x")]
    ),
    "cancel_queued": lambda s, w, n: s.request_cancel(w["queued"].id, "r", False, "op"),
    "cancel_running": lambda s, w, n: s.request_cancel(w["run"].id, "r", False, "op"),
    "cancel_parent": lambda s, w, n: s.request_cancel(w["parent"].id, "r", False, "op"),
    "pause": lambda s, w, n: s.request_pause(w["queued"].id, None, "op"),
    "resume": lambda s, w, n: s.resume(w["paused"].id, None, "op"),
    "retry": lambda s, w, n: s.retry(w["failed"].id, "op"),
    "rescue": lambda s, w, n: s.rescue(),
    "prune": lambda s, w, n: s.prune_jobs("succeeded", 3600.0, 100, None, False),
    "queue_pause": lambda s, w, n: s.set_queue_paused("work", True, "op"),
    "settle": lambda s, w, n: s.update_cancellation(
        CANCELLATION,
        status="completed",
        steps=[],
        result={"slot": n},
        error=None,
        final=True,
        expect="initiated",
    ),
}

PAIRS = list(combinations_with_replacement(OPS, 2))


class Template:
    """The world's rows, saved once and put back before each run, with the triggers
    off (SQLite's dropped and made again). Much faster than building the world again
    for each of 190 pairs."""

    def __init__(self, db: Db) -> None:
        self.db = db
        if db.dialect == "sqlite":
            found = db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'tether%%'"
            )
        else:
            found = db.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            )
        names = sorted(r[0] for r in found if r[0] not in KEPT_TABLES)
        names.remove("tether_jobs")
        self.tables = ["tether_jobs", *names]
        for t in self.tables:
            db.execute(f'CREATE TEMP TABLE "saved_{t}" AS SELECT * FROM "{t}"')
        self.triggers: list[tuple[str, str]] = []
        if db.dialect == "sqlite":
            rows = db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
            self.triggers = [(str(n), str(q)) for n, q in rows]

    def restore(self) -> None:
        db = self.db
        db.execute("BEGIN IMMEDIATE" if db.dialect == "sqlite" else "BEGIN")
        if db.dialect == "postgresql":
            db.execute("SET LOCAL session_replication_role = replica")
        for name, _ in self.triggers:  # SQLite cannot switch triggers off
            db.execute(f'DROP TRIGGER "{name}"')
        for t in self.tables:
            db.execute(f'DELETE FROM "{t}"')
        for t in self.tables:
            db.execute(f'INSERT INTO "{t}" SELECT * FROM "saved_{t}"')
        for _, sql in self.triggers:
            db.execute(sql)
        db.execute("COMMIT")


def snapshot(db: Db, world: World) -> list[tuple[Any, ...]]:
    """The end state: every job (by role, or by task and args for new ones) with its
    state and flags; the cancellation records; the paused queues."""
    roles = {j.id: role for role, j in world.jobs.items()}
    out: list[tuple[Any, ...]] = []
    for jid, task, args, state, waiting, cancel, pause in db.execute(
        "SELECT id, task, args, state, waiting_children, cancel_requested_at IS NOT NULL, "
        "pause_requested_at IS NOT NULL FROM tether_jobs"
    ):
        data = json.loads(args) if isinstance(args, str) else args
        label = roles.get(jid) or f"{task}{json.dumps(data, sort_keys=True)}"
        out.append(("job", label, state, bool(waiting), bool(cancel), bool(pause)))
    for cid, status, result in db.execute(
        "SELECT id, status, result FROM tether_cancellations ORDER BY id"
    ):
        data = json.loads(result) if isinstance(result, str) else result
        out.append(("cancellation", cid, status, json.dumps(data, sort_keys=True)))
    for (name,) in db.execute("SELECT name FROM tether_queues WHERE paused = %s", (True,)):
        out.append(("paused queue", name))
    return sorted(out, key=repr)


async def _serial(
    store: Store, db: Db, template: Template, world: World, ops: list[tuple[Op, int]]
) -> list[tuple[Any, ...]]:
    """Run ``ops`` one after the other, each with its slot (0: the pair's first)."""
    template.restore()
    for op, slot in ops:
        # An operation that refuses leaves the order's state without it.
        with contextlib.suppress(Exception):
            await op(store, world, slot)
    assert stuck_jobs(db) == [], "a job waits on something that has already happened"
    return snapshot(db, world)


def _bind(op: Op, world: World, slot: int) -> Callable[[Store], Awaitable[Any]]:
    return lambda s: op(s, world, slot)


async def test_two_operations_at_once_end_as_one_of_their_serial_orders(
    store: Store, db: Db, db_url: str
) -> None:
    world = await build_world(store, db)
    template = Template(db)
    failures: dict[str, str] = {}
    if db.dialect == "sqlite":
        for a, b in PAIRS:
            try:
                await _serial(store, db, template, world, [(OPS[a], 0), (OPS[b], 1)])
                await _serial(store, db, template, world, [(OPS[b], 1), (OPS[a], 0)])
            except AssertionError as exc:
                failures[f"{a}+{b}"] = str(exc)
        assert not failures, _report(failures)
        return
    async with Barrier(db_url) as barrier:
        for a, b in PAIRS:
            first, second = OPS[a], OPS[b]
            template.restore()
            results = await barrier.run([_bind(first, world, 0), _bind(second, world, 1)])
            # A finish skips a row the other transaction holds and leaves that outcome
            # for later (still its lease): the completer's next round writes it.
            for (op, slot), result in zip(((first, 0), (second, 1)), results, strict=True):
                if isinstance(result, Finished) and result.held:
                    await op(store, world, slot)
            # A workflow step that waited for a row lock past its bound (the two
            # transactions lock a parent and its children in opposite orders: a finishing
            # child, then its parent; a cancelled parent, then its children) was left in
            # tether_pending_steps: the maintenance leader's releaser runs it again.
            if db.execute("SELECT 1 FROM tether_pending_steps"):
                await store.release_stuck(0, 100)
            if stuck := stuck_jobs(db):
                failures[f"{a}+{b}"] = f"jobs {stuck} wait on something that has already happened"
                continue
            together = snapshot(db, world)
            try:
                ab = await _serial(store, db, template, world, [(first, 0), (second, 1)])
                if together != ab:
                    ba = await _serial(store, db, template, world, [(second, 1), (first, 0)])
                    if together != ba:
                        failures[f"{a}+{b}"] = _diff(together, ab, ba) + f"\n  results: {results}"
            except AssertionError as exc:
                failures[f"{a}+{b}"] = str(exc)
    assert not failures, _report(failures)


def _report(failures: dict[str, str]) -> str:
    return f"{len(failures)} of {len(PAIRS)} pairs failed:\n" + "\n".join(
        f"{pair}: {what}" for pair, what in failures.items()
    )


def _diff(got: list[Any], ab: list[Any], ba: list[Any]) -> str:
    return (
        f"concurrent state matches neither serial order:\n"
        f"  only concurrent vs a;b: {sorted(set(got) - set(ab), key=repr)}\n"
        f"  only a;b: {sorted(set(ab) - set(got), key=repr)}\n"
        f"  only concurrent vs b;a: {sorted(set(got) - set(ba), key=repr)}\n"
        f"  only b;a: {sorted(set(ba) - set(got), key=repr)}"
    )


@pytest.mark.postgres
async def test_two_spawns_of_one_parent_committed_together_both_land(pg_url: str) -> None:
    # Found by the pairs above: each spawn held the parent's row in share mode, then
    # waited for the other's to mark the parent has_children (a deadlock, 6 runs in 10).
    # (SQLite: one writer at a time, two spawns are never open together.)
    store = create_store(pg_url)
    try:
        async with Barrier(pg_url) as barrier:
            for _ in range(5):
                parent = await running_job(store, "wp", task="parent")

                def spawn(slot: int, p: Job = parent) -> Callable[[Store], Awaitable[Any]]:
                    return lambda s: s.spawn(p.id, p.lease_token, new_job("kid", args={"n": slot}))

                results = await barrier.run([spawn(0), spawn(1)])
                assert all(isinstance(r, Job) for r in results), results
    finally:
        await store.close()
