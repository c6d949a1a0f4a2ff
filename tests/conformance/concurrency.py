"""Concurrent writers on purpose: operations held at commit behind a barrier.

:func:`commit_together` runs store operations at once on PostgreSQL, each in its own
transaction on its own connection (the store's caller-transaction mode, as
``connection=`` uses it), lets every one of them run its statements, and commits them
at the same moment. An operation whose statement waits on a lock another one holds
cannot reach the barrier: the others commit first, then it goes on and commits. This
is the situation a sequential test never makes: two transactions that each decided
from a snapshot in which the other had not happened yet.

SQLite has one writer at a time, so there two write transactions cannot both be open;
the pair tests run both serial orders there (interleavings of SQLite's write steps are
the commit-step scheduler's subject, not this module's).

:func:`stuck_jobs` states the invariant every pair must keep: no job waits on something
that has already happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg

from tether.store import Store, caller_store

from .support import Db

Op = Callable[[Store], Awaitable[Any]]

# How long an operation may take to reach the barrier or a lock wait; far above any.
_REACH_TIMEOUT = 30.0


async def _lock_waiters(admin: psycopg.AsyncConnection[Any], pids: Sequence[int]) -> set[int]:
    cur = await admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s) AND wait_event_type = 'Lock'",
        (list(pids),),
    )
    return {r[0] for r in await cur.fetchall()}


class Barrier:
    """Connections for :meth:`run`, kept open across runs (two runs never overlap)."""

    def __init__(self, url: str, width: int = 2) -> None:
        self.url = url
        self.width = width
        self._admin: psycopg.AsyncConnection[Any] | None = None
        self._conns: list[psycopg.AsyncConnection[Any]] = []

    async def __aenter__(self) -> Barrier:
        self._admin = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        self._conns = [await psycopg.AsyncConnection.connect(self.url) for _ in range(self.width)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in self._conns:
            await c.close()
        if self._admin is not None:
            await self._admin.close()

    async def run(self, ops: Sequence[Op], *, refuse_lock_waits: bool = False) -> list[Any]:
        """See :func:`commit_together`."""
        assert self._admin is not None and len(ops) <= self.width
        admin, conns = self._admin, self._conns[: len(ops)]
        pids = [c.info.backend_pid for c in conns]
        tasks: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(op(caller_store(self.url, c)))
            for op, c in zip(ops, conns, strict=True)
        ]
        out: list[Any] = [None] * len(ops)
        remaining = set(range(len(ops)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _REACH_TIMEOUT
        while remaining:
            # The barrier: every remaining operation has run its statements, or waits
            # on a lock (held by one that has, or by another that waits: a deadlock,
            # which the server breaks).
            while True:
                waiting = await _lock_waiters(admin, [pids[i] for i in remaining])
                ready = sorted(i for i in remaining if tasks[i].done())
                assert not (refuse_lock_waits and waiting), "an operation waits on a lock"
                if ready and all(tasks[i].done() or pids[i] in waiting for i in remaining):
                    break
                assert loop.time() < deadline, "an operation never reached the barrier"
                await asyncio.sleep(0.002)

            async def end(i: int) -> None:
                exc = tasks[i].exception()
                try:
                    if exc is None:
                        await conns[i].commit()
                        out[i] = tasks[i].result()
                    else:
                        await conns[i].rollback()
                        out[i] = exc
                except psycopg.Error as commit_failed:
                    out[i] = commit_failed

            await asyncio.gather(*(end(i) for i in ready))
            remaining -= set(ready)
        return out


async def commit_together(
    url: str, ops: Sequence[Op], *, refuse_lock_waits: bool = False
) -> list[Any]:
    """Run ``ops`` concurrently on PostgreSQL, each in its own transaction on its own
    connection, and commit those that ran to the end at the same moment (repeatedly,
    while others wait on their locks). Returns each operation's result, or the
    exception it (or its commit) raised.

    With ``refuse_lock_waits``, an operation that waits on a lock fails the test (it
    would wait for whatever holds the lock, a caller's open transaction say)."""
    async with Barrier(url, len(ops)) as barrier:
        return await barrier.run(ops, refuse_lock_waits=refuse_lock_waits)


_ACTIVE = "('queued', 'blocked', 'running', 'retrying', 'paused')"

STUCK_SQL = f"""
SELECT b.id FROM tether_jobs b WHERE b.state = 'blocked' AND (
    (b.waiting_children AND NOT EXISTS (
        SELECT 1 FROM tether_jobs c WHERE c.parent_id = b.id AND c.state IN {_ACTIVE}))
    OR (NOT b.waiting_children AND EXISTS (
            SELECT 1 FROM tether_dependencies d WHERE d.job_id = b.id)
        AND NOT EXISTS (
            SELECT 1 FROM tether_dependencies d JOIN tether_jobs u ON u.id = d.depends_on
            WHERE d.job_id = b.id AND u.state <> 'succeeded'))
    OR (NOT b.waiting_children AND EXISTS (
        SELECT 1 FROM tether_dependencies d JOIN tether_jobs u ON u.id = d.depends_on
        WHERE d.job_id = b.id
          AND (u.state = 'failed' OR (u.state = 'cancelled' AND u.cancel_cascade = %s))))
) ORDER BY b.id
"""


def stuck_jobs(db: Db) -> list[int]:
    """The blocked jobs that wait on something that has already happened: a parent
    whose children have all ended, a dependent whose dependencies all succeeded, or one
    of a dependency that failed or was cancelled with cascade."""
    true = 1 if db.dialect == "sqlite" else True
    return [int(r[0]) for r in db.execute(STUCK_SQL, (true,))]
