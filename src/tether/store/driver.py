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

from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
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
