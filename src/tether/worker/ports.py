"""What the worker's parts may ask of the worker: one narrow port each.

The claimer, the heartbeater and the handler threads never hold the
:class:`~tether.worker.worker.Worker` itself. Each gets the store protocol it writes
through, the worker's id and config, one of these ports (the worker implements all
three), and plain callables for what it needs from its siblings (the claimer asks
``healthy()`` of the heartbeater and ``room()`` of the threads, say). So a part's
constructor lists everything it may touch, and no part imports the worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tether.job import Job
from tether.worker.run import Run


class Launcher(Protocol):
    """The worker as the claimer sees it: whether to claim, how much, and where the
    claimed jobs go."""

    @property
    def stopping(self) -> bool:
        """The worker is stopping: a job claimed now is handed back unstarted."""

    def free_slots(self) -> int:
        """How many more jobs may be claimed now."""

    def launch(self, job: Job, *, leased_at: float | None = None) -> None:
        """Run a claimed job (``leased_at``: loop time the claim was sent)."""

    def hand_back(self, job: Job) -> None:
        """Release a job claimed as the worker began to stop, without starting it."""

    async def found(self, count: int) -> None:
        """A claim round came back with ``count`` jobs (already launched or handed
        back): the worker is idle if it found none and holds none, else busy, and its
        store sizes its connections by that."""


class Holder(Protocol):
    """The worker as the heartbeater sees it: the attempts it holds, and how to stop
    one."""

    @property
    def running(self) -> Mapping[int, Run]:
        """Every attempt held, by job id (including those whose outcome is being
        written)."""

    def beating(self) -> list[Run]:
        """The attempts whose leases the next heartbeat extends."""

    def interrupt(
        self, run: Run, reason: str, *, force: bool = False, detail: str | None = None
    ) -> None:
        """Ask a running job to stop (``cancel``, ``pause``, ``lease_lost``)."""

    async def log_requests(self, heard: list[tuple[Run, str]]) -> None:
        """Log the cancel and pause requests heard, once per request."""


class PoolOwner(Protocol):
    """The worker as its handler threads see it: whether it stops, and the two things
    a change in the pool may ask of it."""

    @property
    def stopping(self) -> bool:
        """The worker is stopping."""

    def claim_more(self) -> None:
        """A slot or a thread came free: claim again now (unless stopping)."""

    def restart(self) -> None:
        """Stop gracefully, for the supervisor to start a fresh worker (exit code
        :data:`~tether.worker.threads.EXIT_RESTART`)."""
