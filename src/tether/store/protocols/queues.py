"""Queues and limits: pause flags, concurrency keys, resource pools, rate limits."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tether.job import LimitInfo, QueueBacklog, QueueInfo, RateLimitInfo


@runtime_checkable
class QueueStore(Protocol):
    """Queues and what throttles them: queue pause flags, concurrency keys and resource
    pools, rate limits, and the waiting work per queue and task."""

    async def set_queue_paused(self, name: str, paused: bool, reason: str | None) -> None:
        """Pause or resume claims from a queue."""

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue that has jobs or a pause flag."""

    async def queue_backlog(self) -> list[QueueBacklog]:
        """Jobs waiting, due and running per queue (every queue that has any, or a pause
        flag), read from the partial indexes of the live jobs only."""

    async def define_limit(self, name: str, kind: str, capacity: int, block_on_hold: bool) -> None:
        """Create or change a concurrency key or resource pool."""

    async def list_limits(self) -> list[LimitInfo]:
        """Every key and resource pool with its counters."""

    async def waiting_by_task(self) -> dict[tuple[str, str], int]:
        """Queued and retrying jobs, counted by ``(queue, task)``."""

    async def set_rate_limit(self, scope: str, name: str, per_second: float, burst: int) -> None:
        """Create or change the rate limit of a queue or task (``scope``); a new or
        changed limit starts with a full bucket."""

    async def remove_rate_limit(self, scope: str, name: str) -> bool:
        """Drop a rate limit; ``False`` if there was none."""

    async def list_rate_limits(self) -> list[RateLimitInfo]:
        """Every rate limit, by scope and name."""
