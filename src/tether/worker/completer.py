"""The completer: records outcomes in batches, fenced by lease token."""

from __future__ import annotations

import asyncio
import logging

from tether.job import Outcome
from tether.service import Service
from tether.store import Store

# Every part of the worker logs as ``tether.worker``: operators filter on that one name.
log = logging.getLogger("tether.worker")


class Completer(Service):
    """Records outcomes; whatever piles up during one write goes in the next."""

    name = "completer"

    def __init__(self, store: Store, worker_id: str) -> None:
        super().__init__(1.0, max_consecutive_errors=1, max_backoff=5.0, logger=log)
        self.store = store
        self.worker_id = worker_id
        self.pending: list[tuple[Outcome, asyncio.Future[bool]]] = []
        #: Set while no write is in progress (a stopping worker waits for it).
        self.idle = asyncio.Event()
        self.idle.set()

    def submit(self, outcome: Outcome) -> asyncio.Future[bool]:
        """Queue an outcome; the future says whether the store accepted it."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.pending.append((outcome, fut))
        self.wake()
        return fut

    async def run_once(self) -> int:
        """Write what is pending; returns how many outcomes were written."""
        batch, self.pending = self.pending, []
        if not batch:
            return 0
        self.idle.clear()
        try:
            accepted = await self.store.finish(self.worker_id, [o for o, _ in batch])
        except BaseException:
            self.pending[:0] = batch
            raise
        finally:
            self.idle.set()
        for outcome, fut in batch:
            if not fut.done():
                fut.set_result(outcome.job_id in accepted)
        return len(batch)
