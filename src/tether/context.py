"""What a handler gets: its job, its cancel signal, checkpoints and progress."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from tether import joblog, payload
from tether.errors import Cancelled, InvalidJobError, LeaseLostError, PayloadTooLargeError
from tether.job import JSON, Job

if TYPE_CHECKING:
    from tether.durable import Steps

T = TypeVar("T")


class CancelSignal:
    """Set when the job must stop; readable from the event loop and from threads.

    ``reason`` says why: ``cancel`` (a person asked), ``pause`` (a person or the job's
    budget asked; it will resume from its checkpoint), ``shutdown`` (the worker is
    stopping and the job will be released), or ``lease_lost`` (another worker may own
    the job now; nothing this attempt writes will count).

    The same kind of signal is ``ctx.stopping``, raised (reason ``shutdown``) as soon as
    the worker begins a graceful stop, while the job may still run.

    For a cancel or a pause, ``detail`` is the request's own reason and
    ``cancellation_id`` the cancellation's record, once the worker has read them (a
    moment after the signal; ``None`` until then).
    """

    __slots__ = (
        "_described",
        "_event",
        "_flag",
        "_raised",
        "cancellation_id",
        "detail",
        "reason",
    )

    def __init__(self, *, threaded: bool = False) -> None:
        # Events are made only where they can be waited on: one per job adds up.
        self._raised = False
        self._event: asyncio.Event | None = None
        self._flag = threading.Event() if threaded else None
        self.reason: str | None = None
        self.detail: str | None = None
        self.cancellation_id: str | None = None
        self._described: asyncio.Event | None = None

    def set(self, reason: str) -> None:
        """Raise the signal (from the event loop thread, or a signal handler)."""
        if self.reason is None:
            self.reason = reason
        self._raised = True
        if self._flag is not None:
            self._flag.set()
        if self._event is not None:
            self._event.set()

    def describe(self, detail: str | None, cancellation_id: str | None) -> None:
        """Record the request's reason and record, once read (from the event loop)."""
        self.detail = detail
        self.cancellation_id = cancellation_id
        if self._described is None:
            self._described = asyncio.Event()
        self._described.set()

    async def described(self, timeout: float) -> None:
        """Return once :meth:`describe` was called, or after ``timeout`` seconds."""
        if self._described is None:
            self._described = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._described.wait(), timeout)

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
        steps: Callable[[], Steps] | None = None,
        write_log: Callable[[int, int, joblog.PendingLine], None] | None = None,
    ) -> None:
        self.job = job
        self._write_log = write_log
        # Made at the first step, sleep or wait: most jobs use none, and the launch of
        # a job is on the hot path.
        self._make_steps = steps
        self._steps: Steps | None = None
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

    # -- durable steps, sleeps, signals and fenced effects (tether.durable) ------------

    @property
    def durable(self) -> Steps:
        """The job's durable steps (for the sync context and the ``@tether.step`` form)."""
        if self._steps is None:
            if self._make_steps is None:
                raise InvalidJobError("durable steps need a job run by a worker")
            self._steps = self._make_steps()
        return self._steps

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once per job, as the step ``name``, and return its
        result (awaited if it is a coroutine).

        The result is stored as JSON under the job's lease, and a later attempt (a
        retry, a rescue, a resume, a restart after a crash) gets it back without
        running ``fn`` again: a JSON round trip, so a tuple comes back as a list. Code
        outside steps runs again on every attempt. A step that raises is not stored,
        and the job's retry policy applies. After a lost lease the result is refused:
        :class:`~tether.errors.LeaseLostError`. Each name may be used once per run
        (:class:`~tether.errors.DuplicateStepError`); number them in a loop
        (``f"page:{i}"``). Usage reported while it runs is recorded with the step.
        """
        return await self.durable.step(name, fn, *args, **kwargs)

    async def sleep(self, seconds: float, *, name: str | None = None) -> None:
        """Sleep durably: the job gives back its lease and its slot, spends no attempt,
        and runs again after ``seconds`` on any worker, replaying its handler past its
        completed steps (a sleep already over returns at once).

        Sleeps are named ``sleep:1``, ``sleep:2``... in the order a run reaches them;
        give ``name`` to keep a name stable when code changes. Pause, cancel and
        budgets act on a sleeping job as on a queued one.
        """
        await self.durable.sleep(seconds, name)

    async def sleep_until(self, when: datetime, *, name: str | None = None) -> None:
        """:meth:`sleep` until ``when`` (an aware datetime)."""
        if when.tzinfo is None:
            raise InvalidJobError("sleep_until needs an aware datetime (with a time zone)")
        await self.sleep((when - datetime.now(UTC)).total_seconds(), name=name)

    async def wait_for(self, signal: str, *, timeout: float | None = None) -> JSON:
        """Wait for the signal ``signal`` (``app.durable.signal(job_id, signal, payload)``)
        and return its payload.

        A signal sent before the wait is kept and returned at once. Otherwise the job
        gives back its lease and its slot, spends no attempt, and runs again when the
        signal comes, replaying its handler to this point. Past ``timeout`` seconds
        (``None``: no limit) it raises :class:`~tether.errors.SignalTimeoutError`. Each
        signal name is waited for once per job.
        """
        return await self.durable.wait_for(signal, timeout)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A connection to tether's own database in a transaction that commits only if
        this attempt still holds the job's lease: ``async with ctx.transaction() as
        conn:``.

        ``conn`` is a ``psycopg.AsyncConnection`` on PostgreSQL, a ``sqlite3.Connection``
        to the same file on SQLite (holding the write lock: keep it short). Inside
        :meth:`step`, it commits when the step ends, with the step's record: the writes
        commit exactly once per job. Outside a step they commit once per attempt that
        gets that far. If the lease was lost, everything rolls back and
        :class:`~tether.errors.LeaseLostError` is raised.
        """
        return self.durable.transaction()

    def log(self, message: object, level: str | int = "info") -> None:
        """Add a line to the job's own log (``tether job logs ID``, the API, the
        dashboard's job page); never blocks.

        ``level``: ``debug``, ``info``, ``warning``, ``error``, ``critical`` (or a
        ``logging`` level). Lines are written in batches within a fraction of a second,
        and before the job's outcome; the ``logging`` module's records emitted inside
        the handler land here too. The job keeps its first lines, up to
        ``AppConfig.job_log_max_lines`` and ``job_log_max_bytes``; later ones are
        counted, not kept. Lines written after the lease was lost are not kept.
        """
        line = joblog.pending(message, level, time.time())
        if self._write_log is not None:
            self._write_log(self.job.id, self.job.lease_token, line)

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

    def log(self, message: object, level: str | int = "info") -> None:
        """Add a line to the job's own log (see :meth:`JobContext.log`); never blocks."""
        self._ctx.log(message, level)

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

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` once per job as the step ``name`` (see :meth:`JobContext.step`);
        ``fn`` runs in this thread."""
        steps = self._ctx.durable
        done = self._call(steps.begin(name))
        if done is not None:
            return done.result
        used = self._ctx.usage
        encoded, frame, took = steps.run_in_thread(name, fn, args, kwargs)
        usage = max(0, self._ctx.usage - used)
        if frame.fenced is None:
            return self._call(steps.save(name, encoded, took, usage))
        try:
            asyncio.run(frame.fenced.commit(name, encoded, took, usage))
        except LeaseLostError:
            self._loop.call_soon_threadsafe(steps.note_lost)
            raise
        finally:
            asyncio.run(frame.fenced.close())
        return self._call(steps.remember(name, encoded, usage))

    def sleep(self, seconds: float, *, name: str | None = None) -> None:
        """Sleep durably (see :meth:`JobContext.sleep`)."""
        self._call(self._ctx.sleep(seconds, name=name))

    def sleep_until(self, when: datetime, *, name: str | None = None) -> None:
        """Sleep durably until ``when`` (see :meth:`JobContext.sleep_until`)."""
        self._call(self._ctx.sleep_until(when, name=name))

    def wait_for(self, signal: str, *, timeout: float | None = None) -> JSON:
        """Wait for a signal (see :meth:`JobContext.wait_for`)."""
        return self._call(self._ctx.wait_for(signal, timeout=timeout))

    def transaction(self) -> contextlib.AbstractContextManager[Any]:
        """A fenced transaction (see :meth:`JobContext.transaction`): a blocking
        ``psycopg.Connection`` or a ``sqlite3.Connection``, in this thread."""
        return self._ctx.durable.transaction_sync()

    def _call(self, coro: Awaitable[T]) -> T:
        async def run() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()


Context = JobContext | SyncJobContext
Handler = Callable[..., Any]

CURRENT: ContextVar[Context | None] = ContextVar("tether_job_context", default=None)
"""The context of the job whose handler runs here (set by the worker for the handler's
task or thread): what ``@tether.step`` functions run their steps in."""
