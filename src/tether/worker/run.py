"""One attempt in progress on a worker, and the heartbeat entry for its lease."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tether.context import JobContext
from tether.executors import Handle
from tether.job import Beat, Job
from tether.task import Task


@dataclass(eq=False)
class Run:
    """One attempt in progress on this worker."""

    job: Job
    task: Task
    ctx: JobContext
    handle: Handle | None = None
    #: The handler has ended (or was abandoned) and its slot is free.
    settled: bool = False
    interrupt: str | None = None
    detail: str | None = None
    stopped_by_us: bool = False
    timed_out: bool = False
    finishing: bool = False
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    # Loop time the claim that leased it, or the last heartbeat that extended its lease,
    # was sent: its lease runs for a lease_duration from no earlier than that.
    leased_at: float = 0.0
    began: float = 0.0
    #: Why it was asked to stop (the cancel or pause request's reason), for the log.
    reason: str | None = None
    #: The id of the cancellation that stopped it, once the worker has read it (for the
    #: log and the outcome hooks).
    cancellation_id: str | None = None
    #: The requests (cancel, pause) already logged: the heartbeat repeats them.
    logged: set[str] = field(default_factory=set)


def beat(run: Run) -> Beat:
    """What the heartbeat sends for ``run``: its lease, its progress, and its usage if
    the handler changed it."""
    usage = run.ctx.usage if run.ctx.usage != run.job.usage else None
    return Beat(run.job.id, run.job.lease_token, *run.ctx.progress, usage=usage)
