"""A commit-step scheduler for SQLite: every interleaving of two operations.

SQLite runs each store's statements on one thread, and every hop to that thread is
either one read or one whole write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``). The
store awaits its ``step`` hook before each hop. Here that hook parks the operation, and
a scheduler decides which of two parked operations takes its next step. So an
operation is the sequence of its transactions, and the scheduler enumerates every
interleaving of two such sequences (depth first, re-running from a fresh copy of the
database for each), as a stateless model checker does.

What happens between two hops of one operation (its Python code) runs as part of the
step before it: it cannot see the other operation's writes until that one takes a
step, which is exactly what the interleavings vary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from tether.errors import TetherError
from tether.store import create_store, parse_sqlite_path
from tether.store.sqlite import SqliteStore

# One operation of a pair: it gets its own store (connection and thread) on the
# database, and what the setup returned.
Op = Callable[[SqliteStore, Any], Awaitable[Any]]
# Called when an operation reaches its n-th step (1-based), before it parks: a test
# makes a producer "stall" there by ageing its rows.
Arrive = Callable[[int, sqlite3.Connection], None]
# Waits longer than this mean an operation blocked outside the scheduler's control.
STEP_TIMEOUT = 30.0


class Gate:
    """Parks one operation before each hop to its store's thread until released."""

    def __init__(self, conn: sqlite3.Connection, arrive: Arrive | None) -> None:
        self.parked = asyncio.Event()
        self._go = asyncio.Event()
        self.steps = 0
        self._conn = conn
        self._arrive = arrive

    async def __call__(self) -> None:
        self.steps += 1
        if self._arrive is not None:
            self._arrive(self.steps, self._conn)
        self.parked.set()
        await self._go.wait()
        self._go.clear()

    def release(self) -> None:
        self.parked.clear()
        self._go.set()


@dataclasses.dataclass
class Run:
    """One interleaving: the choices made, each operation's answer and the end state."""

    choices: list[tuple[int, int]]  # (the operation that went, how many could) per branch
    order: list[int]  # the operation of each step, in the order they ran
    outcomes: list[Any]  # each operation's result, or the exception it raised
    state: Any

    def raised(self, i: int) -> bool:
        return isinstance(self.outcomes[i], BaseException)


@dataclasses.dataclass
class Pair:
    """Two operations on one prepared database, and what to compare at the end."""

    setup: Callable[[SqliteStore], Awaitable[Any]]
    ops: tuple[Op, Op]
    snapshot: Callable[[sqlite3.Connection], Any]
    arrive: tuple[Arrive | None, Arrive | None] = (None, None)


class Scheduler:
    """Runs a :class:`Pair` in every interleaving of its operations' steps."""

    def __init__(self, template: Path, workdir: Path) -> None:
        self.template = template  # a migrated, closed database file
        self.workdir = workdir
        self._runs = 0

    async def run(self, pair: Pair, prefix: Sequence[int], only: int | None = None) -> Run:
        """One run on a fresh copy: at the k-th point where both operations are parked,
        the one that goes is ``prefix[k]`` (the first when past the prefix). ``only``:
        run that operation alone."""
        self._runs += 1
        path = self.workdir / f"run-{self._runs}.db"
        shutil.copy(self.template, path)
        url = f"sqlite:///{path}"
        setup = create_store(url)
        assert isinstance(setup, SqliteStore)
        conn = sqlite3.connect(parse_sqlite_path(url), timeout=10, isolation_level=None)
        stores: list[SqliteStore] = []
        try:
            ctx = await pair.setup(setup)
            which = [0, 1] if only is None else [only]
            gates: list[Gate] = []
            for i in which:
                store = create_store(url)
                assert isinstance(store, SqliteStore)
                await store.open()
                gate = Gate(conn, pair.arrive[i])
                store.step = gate
                stores.append(store)
                gates.append(gate)
            tasks = [
                asyncio.create_task(pair.ops[i](s, ctx)) for i, s in zip(which, stores, strict=True)
            ]
            choices: list[tuple[int, int]] = []
            order: list[int] = []
            while True:
                ready = []
                for n, (task, gate) in enumerate(zip(tasks, gates, strict=True)):
                    if task.done():
                        continue
                    parked = asyncio.create_task(gate.parked.wait())
                    done, _ = await asyncio.wait(
                        {task, parked}, timeout=STEP_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
                    )
                    parked.cancel()
                    assert done, f"operation {which[n]} neither parked nor ended"
                    if gate.parked.is_set():
                        ready.append(n)
                if not ready:
                    break
                pick = 0
                if len(ready) > 1:
                    pick = prefix[len(choices)] if len(choices) < len(prefix) else 0
                    choices.append((pick, len(ready)))
                order.append(which[ready[pick]])
                gates[ready[pick]].release()
            outcomes: list[Any] = [None, None]
            for i, task in zip(which, tasks, strict=True):
                exc = task.exception()
                outcomes[i] = exc if exc is not None else task.result()
                if exc is not None and not isinstance(exc, TetherError):
                    raise exc  # only an explicit refusal may end an operation
            return Run(choices, order, outcomes, pair.snapshot(conn))
        finally:
            for store in stores:
                await store.close()
            await setup.close()
            conn.close()
            path.unlink()

    async def every_interleaving(self, pair: Pair) -> list[Run]:
        """Depth first over the choices: each run's last choice that had an untried
        alternative is moved on to it, and the run repeated up to there."""
        runs: list[Run] = []
        prefix: list[int] = []
        while True:
            run = await self.run(pair, prefix)
            # The same choices must meet the same branch points: the steps depend only
            # on the database, not on timing.
            assert [c for c, _ in run.choices[: len(prefix)]] == prefix, (prefix, run.choices)
            runs.append(run)
            k = len(run.choices) - 1
            while k >= 0 and run.choices[k][0] == run.choices[k][1] - 1:
                k -= 1
            if k < 0:
                return runs
            prefix = [c for c, _ in run.choices[:k]] + [run.choices[k][0] + 1]

    async def serial_states(self, pair: Pair) -> list[Any]:
        """The end states of the two serial orders, and of each operation alone (what
        a refused operation must leave: nothing of its own)."""
        runs = [
            await self.run(pair, [0] * 1000),  # the first operation first
            await self.run(pair, [1] * 1000),  # the second first
        ]
        states = [r.state for r in runs]
        for i in (0, 1):
            states.append((await self.run(pair, [], only=i)).state)
        return states


def jobs_state(conn: sqlite3.Connection) -> tuple[Any, ...]:
    """What an end state is: every job (open-batch jobs marked) and its events, and the
    batches still open. Lease tokens and times are left out: they differ run to run."""
    jobs = conn.execute(
        "SELECT id, queue, state, attempt, idempotency_key, "
        "cancel_requested_at IS NOT NULL, lease_expires_at IS NOT NULL, "
        "batch IS NOT NULL AND batch IN (SELECT id FROM tether_open_batches) "
        "FROM tether_jobs ORDER BY id"
    ).fetchall()
    events = conn.execute(
        "SELECT job_id, from_state, to_state FROM tether_job_history ORDER BY job_id, rank, id"
    ).fetchall()
    batches = conn.execute("SELECT COUNT(*) FROM tether_open_batches").fetchone()[0]
    return tuple(jobs), tuple(events), batches
