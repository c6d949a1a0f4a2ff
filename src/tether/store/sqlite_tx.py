"""The :class:`~tether.store.driver.Tx` of a SQLite connection, run on its store's thread."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from tether.hints import Hints
from tether.store.driver import Params, Row

_LISTS = (list, tuple, set, frozenset)


def _adapt(params: Params | None) -> dict[str, Any]:
    """Lists become JSON text, which the queries unpack with ``json_each``."""
    if not params:
        return {}
    return {k: json.dumps(list(v)) if isinstance(v, _LISTS) else v for k, v in params.items()}


class SqliteTx:
    """Statements on a ``sqlite3`` connection. They block, never suspend: a call's whole
    body runs on the store thread in one step (:func:`~tether.store.driver.run_inline`).
    Hints wait in :attr:`notes` until the caller has committed."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.notes: list[tuple[str, list[str]]] = []

    async def all(self, query: str, params: Params | None = None) -> list[Row]:
        return self._conn.execute(query, _adapt(params)).fetchall()

    async def one(self, query: str, params: Params | None = None) -> Row | None:
        row: Row | None = self._conn.execute(query, _adapt(params)).fetchone()
        return row

    async def tuples(self, query: str, params: Params | None = None) -> list[tuple[Any, ...]]:
        # A row looked up by column name costs a scan of the names.
        cur = self._conn.cursor()
        cur.row_factory = None
        return cur.execute(query, _adapt(params)).fetchall()

    async def run(self, query: str, params: Params | None = None) -> int:
        return self._conn.execute(query, _adapt(params)).rowcount

    async def notify(self, hint: str, keys: Iterable[str]) -> None:
        # Other processes on the file see the commit through their data_version watch.
        self.notes.append((hint, list(keys)))

    def announce(self, hints: Hints) -> None:
        """Publish the hints noted, once the transaction has committed."""
        for hint, keys in self.notes:
            hints.publish(hint, keys)
