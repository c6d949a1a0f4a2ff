"""The store as a cancellation uses it: every call retried while the store fails
transiently (``AppConfig.cancellation_retry``)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

from tether import hints as h
from tether.cancellation.records import CancellationStep, CancellationSummary, Status
from tether.config import StoreRetry
from tether.errors import StoreError
from tether.job import Job, JobFilter
from tether.states import JobState
from tether.store.protocols import CancellationStore, JobStore

#: Jobs read in one query.
READ_CHUNK = 1000
log = logging.getLogger("tether.cancellation")
T = TypeVar("T")


class CancellationBackend(JobStore, CancellationStore, Protocol):
    """What a cancellation touches: the jobs it reads and cancels, and its record."""


class Calls:
    """A cancellation's store calls, each retried with backoff."""

    def __init__(self, store: CancellationBackend, poll_interval: float, retry: StoreRetry) -> None:
        self.store = store
        self.policy = retry
        self._poll = poll_interval

    async def retry(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, tried again with backoff while the store fails transiently; the
        last try's ``StoreError`` is raised."""
        for attempt in range(1, self.policy.attempts):
            try:
                return await call()
            except StoreError as exc:
                delay = self.policy.backoff.delay(attempt)
                log.warning("cancellation: store call failed (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
        return await call()

    async def write(
        self,
        cancellation_id: str,
        status: Status,
        steps: Iterable[CancellationStep],
        result: CancellationSummary | None,
        *,
        error: str | None,
        expect: Status | None,
    ) -> bool:
        """Record a cancellation's steps so far and its status, and once it has a
        ``result``, its end; ``False`` if its status was no longer ``expect``."""
        data = [s.to_json() for s in steps]
        said = result.to_json() if result is not None else None
        return await self.retry(
            lambda: self.store.update_cancellation(
                cancellation_id,
                status=status,
                steps=data,
                result=said,
                error=error,
                final=result is not None,
                expect=expect,
            )
        )

    async def read(self, ids: list[int]) -> list[Job]:
        """The jobs with these ids, in a few queries however many there are."""
        jobs: list[Job] = []
        for i in range(0, len(ids), READ_CHUNK):
            part = tuple(ids[i : i + READ_CHUNK])
            query = JobFilter(ids=part, limit=len(part))
            jobs += await self.retry(functools.partial(self.store.list_jobs, query))
        return sorted(jobs, key=lambda j: j.id)

    async def artifacts(self, jobs: list[Job]) -> list[str]:
        """The artifacts the jobs saved, as ``job_id/name``."""
        # Only a job that ran can have saved artifacts.
        found: list[str] = []
        for target in jobs:
            if target.started_at is not None:
                listed = await self.retry(functools.partial(self.store.list_artifacts, target.id))
                found += [f"{a.job_id}/{a.name}" for a in listed]
        return found

    async def stopped(self, ids: list[int], timeout: float) -> list[Job]:
        """The jobs once none of them runs any more, or as they are at ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with self.store.hints.subscribe(h.CHANGED, [str(i) for i in ids]) as sub:
            while True:
                jobs = await self.read(ids)
                left = deadline - loop.time()
                if left <= 0 or all(j.state is not JobState.RUNNING for j in jobs):
                    return jobs
                await sub.get(min(self._poll, left))
