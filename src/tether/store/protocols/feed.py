"""The live feed of job transitions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tether.job import FeedEvent
from tether.store.protocols.listen import ListenStore


@runtime_checkable
class FeedStore(ListenStore, Protocol):
    """The live feed: every job transition by event id, for the API's Server-Sent
    Events and dashboards."""

    async def feed(
        self,
        after_id: int,
        *,
        job_id: int | None,
        queue: str | None,
        owner: str | None,
        states: Sequence[str] | None,
        limit: int,
    ) -> list[FeedEvent]:
        """Transitions with an event id above ``after_id``, oldest first, filtered."""

    async def announce_follower(self, ttl: float) -> None:
        """Say, for ``ttl`` seconds, that a feed follows: every transition is stored
        meanwhile, those a job's row could give included (a no-op where they always
        are)."""

    async def last_event_id(self) -> int:
        """The newest event id, 0 if there is none."""
