"""What a handler gets: its job, its cancel signal, checkpoints and progress."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tether import payload
from tether.errors import Cancelled, LeaseLostError, PayloadTooLargeError
from tether.job import JSON, Job

T = TypeVar("T")


class CancelSignal:
    """Set when the job must stop; readable from the event loop and from threads.

    ``reason`` says why: ``cancel`` (a person asked), ``pause`` (a person or the job's
    budget asked; it will resume from its checkpoint), ``shutdown`` (the worker is
    stopping and the job will be released), or ``lease_lost`` (another worker may own
    the job now; nothing this attempt writes will count).

    The same kind of signal is ``ctx.stopping``, raised (reason ``shutdown``) as soon as
    the worker begins a graceful stop, while the job may still run.
    """

    __slots__ = ("_event", "_flag", "_raised", "reason")

    def __init__(self, *, threaded: bool = False) -> None:
        # Events are made only where they can be waited on: one per job adds up.
        self._raised = False
        self._event: asyncio.Event | None = None
        self._flag = threading.Event() if threaded else None
        self.reason: str | None = None

    def set(self, reason: str) -> None:
        """Raise the signal (from the event loop thread, or a signal handler)."""
        if self.reason is None:
            self.reason = reason
        self._raised = True
        if self._flag is not None:
            self._flag.set()
        if self._event is not None:
            self._event.set()

    def is_set(self) -> bool:
        """Whether the job has been asked to stop."""
        return self._raised

    def __bool__(self) -> bool:
        return self.is_set()

    async def wait(self) -> None:
        """Return once the signal is raised."""
        if self._raised:
            return
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()

    def wait_sync(self, timeout: float | None = None) -> bool:
        """Block a thread until the signal is raised or ``timeout`` passes."""
        if self._flag is None:
            raise RuntimeError("wait_sync() is for thread and process handlers")
        return self._flag.wait(timeout)


class JobContext:
    """Handed to async handlers as their first argument.

    ``checkpoint`` is what the previous attempt saved (``None`` at first). Every write
    carries the lease token: after the lease is lost it raises
    :class:`~tether.errors.LeaseLostError` and changes nothing.

    Two signals tell a handler to wind down:

    - ``cancelled``: the job must stop now (cancel, pause, lost lease, or the end of a
      graceful stop); see :class:`CancelSignal` for the reasons.
    - ``stopping``: the worker began a graceful stop (SIGTERM). The job may still finish
      within ``stop_timeout``; after that it is stopped and released to ``queued``. A
      handler that would rather not start over saves a checkpoint now. It may then
      either keep going, or end at once by raising :class:`~tether.errors.Cancelled`
      (``ctx.check_stopping()`` does): either way the job goes back to ``queued`` with
      that checkpoint, and the attempt is not spent. The next attempt starts from it.
    """

    def __init__(
        self,
        job: Job,
        *,
        save: Callable[[str], Awaitable[bool]],
        save_artifact: Callable[[str, bytes], Awaitable[bool]],
        on_lease_lost: Callable[[], None],
        on_usage: Callable[[int], None],
        spawn: Callable[[str, dict[str, JSON]], Awaitable[Job]],
        children: Callable[[], Awaitable[list[Job]]],
        max_payload_bytes: int,
        max_artifact_bytes: int,
        threaded: bool = False,
    ) -> None:
        self.job = job
        self.cancelled = CancelSignal(threaded=threaded)
        self.stopping = CancelSignal(threaded=threaded)
        self.checkpoint: JSON | None = job.checkpoint
        self.progress: tuple[int | None, int | None] = (job.progress_current, job.progress_total)
        self.usage = job.usage
        self._save = save
        self._save_artifact = save_artifact
        self._on_lease_lost = on_lease_lost
        self._on_usage = on_usage
        self._spawn = spawn
        self._children = children
        self._max_payload = max_payload_bytes
        self._max_artifact = max_artifact_bytes

    @property
    def id(self) -> int:
        """The job id."""
        return self.job.id

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        return self.job.attempt

    @property
    def phase(self) -> str | None:
        """The current phase: ``None`` first ("ingest"), then what ``WaitForChildren`` named."""
        return self.job.phase

    def check_cancelled(self) -> None:
        """Raise :class:`~tether.errors.Cancelled` if the job has been asked to stop."""
        if self.cancelled.is_set():
            raise Cancelled(self.cancelled.reason or "cancel")

    def check_stopping(self) -> None:
        """Raise :class:`~tether.errors.Cancelled` (reason ``shutdown``) once the worker
        is stopping; the job is released unspent, with its last checkpoint."""
        if self.stopping.is_set():
            raise Cancelled("shutdown")

    async def spawn(self, task: Any, **args: JSON) -> Job:
        """Create a child job (``task`` is a Task or its name).

        Fenced by this job's lease: once the job was cancelled, deleted or rescued it
        raises :class:`~tether.errors.LeaseLostError` and creates nothing.
        """
        name = task if isinstance(task, str) else task.name
        return await self._spawn(name, args)

    async def children(self) -> list[Job]:
        """The jobs this job spawned, with their states and results."""
        return await self._children()

    async def save_checkpoint(self, data: JSON) -> None:
        """Durably save ``data``; the next attempt starts with it as ``ctx.checkpoint``."""
        try:
            encoded = payload.encode(data)
        except ValueError as exc:
            raise ValueError(f"checkpoint cannot be stored: {exc}") from exc
        if len(encoded.encode()) > self._max_payload:
            raise PayloadTooLargeError(f"checkpoint exceeds {self._max_payload} bytes")
        if not await self._save(encoded):
            self._on_lease_lost()
            raise LeaseLostError(f"job {self.id} lost its lease; checkpoint not saved")
        self.checkpoint = data

    def set_progress(self, current: int, total: int | None = None) -> None:
        """Report progress; it is written with the worker's next heartbeat."""
        self.progress = (current, total if total is not None else self.progress[1])

    def report_usage(self, amount: int) -> None:
        """Count ``amount`` against the job's budget (tokens, calls, ...).

        Usage is written with the next heartbeat. Going over the budget pauses the job:
        ``cancelled`` is raised with reason ``pause``.
        """
        if amount < 0:
            raise ValueError("usage must not be negative")
        self.usage += amount
        self._on_usage(self.usage)

    async def save_artifact(self, name: str, data: bytes) -> None:
        """Store ``data`` under ``name``; artifacts outlive failure and cancellation."""
        if not name or len(name) > 200:
            raise ValueError("artifact names must be 1 to 200 characters")
        if len(data) > self._max_artifact:
            raise PayloadTooLargeError(f"artifact {name!r} exceeds {self._max_artifact} bytes")
        if not await self._save_artifact(name, bytes(data)):
            self._on_lease_lost()
            raise LeaseLostError(f"job {self.id} lost its lease; artifact not saved")


class SyncJobContext:
    """The same context for handlers that run in a thread: every call blocks."""

    def __init__(self, ctx: JobContext, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop

    @property
    def job(self) -> Job:
        """The job as it was claimed."""
        return self._ctx.job

    @property
    def id(self) -> int:
        """The job id."""
        return self._ctx.id

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        return self._ctx.attempt

    @property
    def cancelled(self) -> CancelSignal:
        """Poll ``ctx.cancelled.is_set()`` or block on ``ctx.cancelled.wait_sync(t)``."""
        return self._ctx.cancelled

    @property
    def checkpoint(self) -> JSON | None:
        """What the previous attempt saved."""
        return self._ctx.checkpoint

    @property
    def stopping(self) -> CancelSignal:
        """Raised when the worker begins a graceful stop (see :class:`JobContext`)."""
        return self._ctx.stopping

    def check_cancelled(self) -> None:
        """Raise :class:`~tether.errors.Cancelled` if the job has been asked to stop."""
        self._ctx.check_cancelled()

    def check_stopping(self) -> None:
        """Raise :class:`~tether.errors.Cancelled` once the worker is stopping."""
        self._ctx.check_stopping()

    def save_checkpoint(self, data: JSON) -> None:
        """Durably save ``data`` (blocks until written)."""
        self._call(self._ctx.save_checkpoint(data))

    def set_progress(self, current: int, total: int | None = None) -> None:
        """Report progress; it is written with the worker's next heartbeat."""
        self._loop.call_soon_threadsafe(self._ctx.set_progress, current, total)

    def report_usage(self, amount: int) -> None:
        """Count ``amount`` against the job's budget."""
        if amount < 0:
            raise ValueError("usage must not be negative")
        self._loop.call_soon_threadsafe(self._ctx.report_usage, amount)

    def save_artifact(self, name: str, data: bytes) -> None:
        """Store an artifact (blocks until written)."""
        self._call(self._ctx.save_artifact(name, data))

    @property
    def phase(self) -> str | None:
        """The current phase (see :attr:`JobContext.phase`)."""
        return self._ctx.phase

    def spawn(self, task: Any, **args: JSON) -> Job:
        """Create a child job (blocks until written)."""
        return self._call(self._ctx.spawn(task, **args))

    def children(self) -> list[Job]:
        """The jobs this job spawned."""
        return self._call(self._ctx.children())

    def _call(self, coro: Awaitable[T]) -> T:
        async def run() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()


Context = JobContext | SyncJobContext
Handler = Callable[..., Any]
