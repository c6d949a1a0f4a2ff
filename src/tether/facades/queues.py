"""``app.queues``: queues (pause, resume, what waits in them), concurrency keys and
resource pools, and rate limits."""

from __future__ import annotations

import dataclasses
from typing import Any

from tether import names, serving
from tether.audit import audited
from tether.errors import InvalidJobError, UnknownTaskError
from tether.facades.base import Facade
from tether.job import LimitInfo, QueueBacklog, QueueInfo, RateLimitInfo
from tether.task import Task


def _queue_target(args: dict[str, Any]) -> str:
    return f"queue:{args['name']}"


def _rate_audit_target(args: dict[str, Any]) -> str:
    task = args.get("task")
    if task is not None:
        return f"task:{task.name if isinstance(task, Task) else task}"
    return f"queue:{args.get('queue')}"


def _rate_target(queue: str | None, task: str | Task | None) -> tuple[str, str]:
    """``("queue", name)`` or ``("task", name)``: exactly one of the two must be given."""
    if (queue is None) == (task is None):
        raise InvalidJobError("a rate limit applies to a queue or to a task: give one of them")
    if queue is not None:
        return "queue", names.check("queue", queue)
    assert task is not None
    return "task", names.check("task", task.name if isinstance(task, Task) else task)


class Queues(Facade):
    """Queues, keys and rate limits: what holds jobs back (each change audited)."""

    @audited("queue.pause", _queue_target)
    async def pause(self, name: str, *, reason: str | None = None) -> None:
        """Stop all claims from a queue; running jobs finish."""
        names.check("queue", name)
        store = await self._store()
        await store.set_queue_paused(name, True, reason)

    @audited("queue.resume", _queue_target)
    async def resume(self, name: str) -> None:
        """Let workers claim from a paused queue again."""
        names.check("queue", name)
        store = await self._store()
        await store.set_queue_paused(name, False, None)

    @audited("key.configure", lambda a: f"key:{a['key']}")
    async def configure_key(
        self, key: str, *, max_running: int = 1, block_on_hold: bool = True
    ) -> None:
        """Set how many jobs of a concurrency key may run at once, and whether a paused
        or failed job under the key blocks it (the default)."""
        names.check("key", key)
        if max_running < 1:
            raise InvalidJobError("max_running must be at least 1")
        store = await self._store()
        await store.define_limit(f"key:{key}", "key", max_running, block_on_hold)

    async def limits(self) -> list[LimitInfo]:
        """Concurrency keys and resource pools, with what blocks them."""
        store = await self._store()
        return await store.list_limits()

    @audited("rate_limit.set", lambda a: _rate_audit_target(a))
    async def rate_limit(
        self,
        *,
        queue: str | None = None,
        task: str | Task | None = None,
        per_second: float,
        burst: int | None = None,
    ) -> None:
        """Limit how fast jobs of a queue, or of a task, start: at most ``per_second`` a
        second on average across every worker, and at most ``burst`` at once (default:
        ``max(1, per_second)`` rounded up). Stored in the database; a new or changed
        limit starts with a full bucket. A task the App knows nothing of is refused
        when it has tasks registered (a typo would otherwise limit nothing)."""
        scope, name = _rate_target(queue, task)
        tasks = self.app.tasks
        if scope == "task" and tasks and name not in tasks:
            known = ", ".join(sorted(tasks))
            raise UnknownTaskError(f"unknown task {name!r} (registered: {known})")
        if not per_second > 0:
            raise InvalidJobError(f"per_second must be positive, got {per_second!r}")
        if burst is None:
            burst = max(1, -int(-per_second // 1))
        if burst < 1:
            raise InvalidJobError(f"burst must be at least 1, got {burst!r}")
        store = await self._store()
        await store.set_rate_limit(scope, name, per_second, burst)

    @audited("rate_limit.remove", lambda a: _rate_audit_target(a))
    async def remove_rate_limit(
        self, *, queue: str | None = None, task: str | Task | None = None
    ) -> bool:
        """Drop the rate limit of a queue or task; ``False`` if it had none."""
        scope, name = _rate_target(queue, task)
        store = await self._store()
        return await store.remove_rate_limit(scope, name)

    async def rate_limits(self) -> list[RateLimitInfo]:
        """Every rate limit, with the tokens its bucket holds now."""
        store = await self._store()
        return await store.list_rate_limits()

    async def backlog(self) -> list[QueueBacklog]:
        """Each queue's jobs waiting, due now and running: what an autoscaler scales
        workers on. One cheap read (partial indexes only), fit to be polled."""
        store = await self._store()
        return await store.queue_backlog()

    # Last: below it, ``list`` in the class body would name this method, not the type.
    async def list(self) -> list[QueueInfo]:
        """Queues with their pause flags, job counts and the waiting jobs that no live
        worker can run."""
        store = await self._store()
        queues = await store.list_queues()
        unserved: dict[str, list[serving.Unserved]] = {}
        for u in await self.app.admin.unserved():
            unserved.setdefault(u.queue, []).append(u)
        return [dataclasses.replace(q, unserved=tuple(unserved.get(q.name, ()))) for q in queues]
