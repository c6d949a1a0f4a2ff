"""What the shared store code asks of a database: statements, inside or outside a
transaction.

Every store method is written once, in :mod:`tether.store.common`, as an ``async``
function of a :class:`Tx`. Each dialect supplies the transaction and the SQL text (the
named queries under :mod:`tether.store.sql`) and nothing else of substance:

- PostgreSQL runs the function on the event loop; each statement is a round trip.
- SQLite runs it whole on the store's own thread, where its statements block and never
  suspend (see :func:`run_inline`): one hop to that thread per call, as before.

Parameters are always passed by name, as one mapping. A list or tuple value is an array
on PostgreSQL; the SQLite transaction sends it as JSON text, which its queries unpack
with ``json_each``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

#: Seconds a statement may wait for a row lock another session holds, for the store
#: calls made in this context; ``None``: no bound but the statement timeout. Background
#: duties set it (``Service.lock_wait``): any client may hold any row for as long as it
#: likes, and no heartbeat, rescue, finish, follow-up, prune or schedule statement may
#: wait on one without a bound. Their own statements skip held rows (SKIP LOCKED) where
#: they can; this bounds the rest (an upsert, a trigger's cascade). PostgreSQL applies
#: it as ``SET LOCAL lock_timeout`` in the call's transaction (so it holds under
#: PgBouncer's transaction pooling too) and raises
#: :class:`~tether.errors.RowLocked` when it runs out. SQLite has no row locks: its
#: writers wait for the write lock, bounded by its busy timeout.
LOCK_WAIT: ContextVar[float | None] = ContextVar("tether_lock_wait", default=None)


#: The bound for the writes that wait on one row a person or a worker names, where the
#: caller set none: a worker's fenced INSERT (spawn, artifact) waits on its job's row, a
#: person's delete on the job's. A rescue or a heartbeat holds such a row for
#: milliseconds; anyone else holding it longer gets :class:`~tether.errors.RowLocked`.
ROW_LOCK_WAIT = 2.0


@contextlib.contextmanager
def lock_wait(seconds: float | None) -> Iterator[None]:
    """Bound the row-lock waits of the store calls made inside (see :data:`LOCK_WAIT`)."""
    token = LOCK_WAIT.set(seconds)
    try:
        yield
    finally:
        LOCK_WAIT.reset(token)


Row = Mapping[str, Any]
Params = Mapping[str, Any]


class Tx(Protocol):
    """Statements on one connection: in one transaction (:meth:`SqlBase._transact`), or
    each committed on its own (:meth:`SqlBase._query`)."""

    async def all(self, query: str, params: Params | None = None) -> list[Row]:
        """Every row, each readable by column name."""

    async def one(self, query: str, params: Params | None = None) -> Row | None:
        """The first row, or ``None``."""

    async def tuples(self, query: str, params: Params | None = None) -> list[tuple[Any, ...]]:
        """Every row as a plain tuple: cheaper, for the hot paths."""

    async def run(self, query: str, params: Params | None = None) -> int:
        """Run a statement; the number of rows it changed."""

    async def notify(self, hint: str, keys: Iterable[str]) -> None:
        """Announce ``keys`` on the hint channel ``hint`` (see :mod:`tether.hints`) once
        the transaction commits: to every process through the database where it can
        carry them (PostgreSQL's NOTIFY), and to this process's subscribers."""


Body = Callable[[Tx], Coroutine[Any, Any, T]]


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends to the end, here and now.

    A SQLite transaction's statements block their thread rather than await, so the
    shared store code, written for both dialects as coroutines, completes on the store's
    thread in one step. Anything that would suspend (a real await) is a bug there.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a SQLite store call awaited something other than its database")
