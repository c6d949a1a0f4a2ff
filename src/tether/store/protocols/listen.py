"""Hearing of other processes' commits as they happen."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tether.hints import Hints


@runtime_checkable
class ListenStore(Protocol):
    """The hints that wake whoever waits for a change, and listening for the commits of
    other processes, so that their changes wake waiters too."""

    hints: Hints
    """Wakes waiters when a job changes or is enqueued (NOTIFY on PostgreSQL); this
    process's own writes publish to it directly."""

    async def listen(self) -> None:
        """Start turning other processes' commits into :attr:`hints` (idempotent; the
        watch reconnects by itself). PostgreSQL LISTENs (nothing listens behind a pooler
        without a ``listen_url``: waits poll instead); SQLite polls ``PRAGMA
        data_version``. Without it, waiters still poll."""
