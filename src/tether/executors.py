"""How a handler runs: on the event loop, in a thread, or in a child process.

Every executor returns a :class:`Handle` whose ``future`` settles when the handler is
done, and whose ``stop`` is the executor's strongest way to end it:

- ``async``: the task is cancelled (``CancelledError`` at its next ``await``);
- ``thread``: a thread cannot be stopped, so it is abandoned: the worker stops waiting,
  settles the job, and the thread's later writes fail the lease check;
- ``process``: SIGTERM, then SIGKILL after ``kill_timeout`` (at once when forced).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from tether.context import CURRENT, CancelSignal, JobContext, SyncJobContext
from tether.errors import Cancelled, Fail, InvalidJobError, Retry
from tether.hooks import Hooks
from tether.job import JSON
from tether.joblog import level_name
from tether.task import Task


class Handle(Protocol):
    """A running handler."""

    future: asyncio.Future[Any]
    stopped_by: str | None
    """How the worker ended it, if it did: task_cancelled, abandoned, sigterm, sigkill."""
    abandon_after: float
    """Seconds after ``stop`` at which the worker gives up waiting for the handler."""

    def stop(self, force: bool) -> None:
        """End the handler as the executor allows."""

    def withdraw(self) -> bool:
        """Cancel the handler if it has not started yet; return whether it was."""


class AsyncHandle:
    """An ``async def`` handler running as a task on the worker's loop."""

    def __init__(self, task: Task, ctx: JobContext, grace: float) -> None:
        self.future: asyncio.Future[Any] = asyncio.ensure_future(task.fn(ctx, **ctx.job.args))
        self.stopped_by: str | None = None
        # A handler that swallows CancelledError is abandoned after a grace.
        self.abandon_after = grace

    def stop(self, force: bool) -> None:
        self.stopped_by = "task_cancelled"
        self.future.cancel()

    def withdraw(self) -> bool:
        return False  # a task starts at the loop's next turn


class ThreadHandle:
    """A plain ``def`` handler running in the worker's thread pool.

    ``thread`` is the pool's own future: it ends when the thread is free again, which
    for an abandoned handler may be long after ``future`` was settled.
    """

    def __init__(self, task: Task, ctx: JobContext, threads: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        sync_ctx = SyncJobContext(ctx, loop)
        context = contextvars.copy_context()
        context.run(CURRENT.set, sync_ctx)  # what @tether.step functions find
        call = context.run
        args = ctx.job.args
        self.thread: concurrent.futures.Future[Any] = threads.submit(
            lambda: call(task.fn, sync_ctx, **args)
        )
        self.future: asyncio.Future[Any] = asyncio.wrap_future(self.thread, loop=loop)
        self.stopped_by: str | None = None
        self.abandon_after = 0.0

    def stop(self, force: bool) -> None:
        self.stopped_by = "abandoned"
        self.future.cancel()

    def withdraw(self) -> bool:
        # Future.cancel() succeeds only while the call still waits for a thread.
        return self.thread.cancel()


class ProcessHandle:
    """A handler in a child process of its own, which can always be killed.

    The child talks to the worker over a pipe: checkpoints (acknowledged once the
    fenced write is done), progress, usage, and finally the result or the error.
    """

    def __init__(
        self,
        task: Task,
        ctx: JobContext,
        kill_timeout: float,
        on_signal: Callable[[str, int], None] | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.ctx = ctx
        # Told of every signal sent (its name and the process id), for the worker's log.
        self.on_signal = on_signal
        self.kill_timeout = kill_timeout
        self.future: asyncio.Future[Any] = self.loop.create_future()
        self._outcome: tuple[str, Any] | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self.stopped_by: str | None = None
        self.abandon_after = kill_timeout + 5.0
        self._saves: set[asyncio.Future[None]] = set()
        self._eof = False
        mp = multiprocessing.get_context("spawn")
        self._conn, child_conn = mp.Pipe()
        # Why the worker sends SIGTERM (cancel, pause, shutdown), for the child to read.
        self._reason = mp.Array("c", 32)
        self.proc = mp.Process(
            target=_child_main,
            args=(
                task.fn.__module__,
                task.fn.__qualname__,
                ctx.job.args,
                ctx.checkpoint,
                child_conn,
                self._reason,
                ctx.job.id,
                ctx.job.attempt,
            ),
            name=f"tether-job-{ctx.job.id}",
            daemon=True,
        )
        # The child starts with SIGTERM and SIGINT blocked (a signal mask survives the
        # spawn's exec) and unblocks them once its handler is in place: a stop sent
        # while it still starts up waits for it instead of killing it.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _CHILD_SIGNALS)
        try:
            self.proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child_conn.close()
        self.loop.add_reader(self._conn.fileno(), self._on_message)
        self.loop.add_reader(self.proc.sentinel, self._on_exit)

    def withdraw(self) -> bool:
        return False  # the process was started with the handle

    def stop(self, force: bool) -> None:
        if self.proc.exitcode is not None:
            return
        if force:
            self.stopped_by = "sigkill"
            self._signal(signal.SIGKILL)
            return
        self.stopped_by = self.stopped_by or "sigterm"
        self._reason.value = (self.ctx.cancelled.reason or "cancel").encode()[:31]  # type: ignore[attr-defined]
        self._signal(signal.SIGTERM)
        if self._kill_timer is None:
            self._kill_timer = self.loop.call_later(self.kill_timeout, self._escalate)

    def _escalate(self) -> None:
        if self.proc.exitcode is None:
            self.stopped_by = "sigkill"
            self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        pid = self.proc.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if self.on_signal is not None:
                self.on_signal(sig.name, pid)

    def _on_message(self) -> None:
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            self._eof = True
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self._conn.fileno())
            return
        kind = msg[0]
        if kind == "checkpoint":
            saving = asyncio.ensure_future(self._save(msg[1]))
            self._saves.add(saving)
            saving.add_done_callback(self._saves.discard)
        elif kind == "progress":
            self.ctx.set_progress(msg[1], msg[2])
        elif kind == "usage":
            self.ctx.report_usage(msg[1])
        elif kind == "log":
            self.ctx.log(msg[1], msg[2])
        elif kind in ("result", "error"):
            self._outcome = (kind, msg[1:])

    async def _save(self, data: JSON) -> None:
        try:
            await self.ctx.save_checkpoint(data)
            reply = "ok"
        except Exception as exc:  # the child raises it as its own error
            reply = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):
            self._conn.send(reply)

    def _on_exit(self) -> None:
        self.loop.remove_reader(self.proc.sentinel)
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self._conn.fileno())
        # Drain what the child sent just before it exited (at end of file, poll() stays
        # true, so stop there).
        while self._outcome is None and not self._eof and self._conn.poll():
            self._on_message()
        self.proc.join()
        self._conn.close()
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        if self.future.done():
            return
        if self._outcome is None:
            code = self.proc.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            self.future.set_exception(RuntimeError(f"job process ended by {how}"))
        elif self._outcome[0] == "result":
            self.future.set_result(self._outcome[1][0])
        else:
            self.future.set_exception(_rebuild(*self._outcome[1]))


def _rebuild(kind: str, message: str, delay: float | None) -> BaseException:
    if kind == "fail":
        return Fail(message)
    if kind == "retry":
        return Retry(message, delay)
    if kind == "cancelled":
        return Cancelled(message)
    return RuntimeError(message)


_DURABLE = frozenset({"step", "sleep", "sleep_until", "wait_for", "transaction"})


class ProcessJobContext:
    """The context a process handler gets: the same names, backed by the pipe."""

    def __init__(
        self,
        job_id: int,
        attempt: int,
        checkpoint: JSON | None,
        conn: multiprocessing.connection.Connection,
    ) -> None:
        self.id = job_id
        self.attempt = attempt
        self.checkpoint = checkpoint
        self.cancelled = CancelSignal(threaded=True)
        # A process hears of a graceful stop with its SIGTERM, at ``stop_timeout``.
        self.stopping = CancelSignal(threaded=True)
        self._conn = conn

    def check_cancelled(self) -> None:
        """Raise :class:`~tether.errors.Cancelled` once SIGTERM has arrived."""
        if self.cancelled.is_set():
            raise Cancelled(self.cancelled.reason or "cancel")

    def check_stopping(self) -> None:
        """Raise :class:`~tether.errors.Cancelled` once the worker is stopping."""
        if self.stopping.is_set():
            raise Cancelled("shutdown")

    def __getattr__(self, name: str) -> Any:
        if name in _DURABLE:
            raise InvalidJobError(
                f"ctx.{name}() is not available to executor='process' handlers: durable "
                "steps, sleeps, waits and fenced transactions need an async or a thread "
                "handler (which may run the heavy part in a process of its own)"
            )
        raise AttributeError(name)

    def save_checkpoint(self, data: JSON) -> None:
        """Durably save ``data`` through the worker (blocks until written)."""
        self._conn.send(("checkpoint", data))
        reply = self._conn.recv()
        if reply != "ok":
            raise RuntimeError(f"checkpoint not saved: {reply}")
        self.checkpoint = data

    def set_progress(self, current: int, total: int | None = None) -> None:
        """Report progress."""
        self._conn.send(("progress", current, total))

    def report_usage(self, amount: int) -> None:
        """Count usage against the job's budget."""
        self._conn.send(("usage", amount))

    def log(self, message: object, level: str | int = "info") -> None:
        """Add a line to the job's own log (see :meth:`JobContext.log`)."""
        self._conn.send(("log", str(message), level_name(level)))  # a bad level raises here


#: Signals a job process only takes from its worker, once it is ready for them.
_CHILD_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _child_main(
    module: str,
    qualname: str,
    args: dict[str, JSON],
    checkpoint: JSON | None,
    conn: multiprocessing.connection.Connection,
    reason: Any,
    job_id: int,
    attempt: int,
) -> None:
    ctx = ProcessJobContext(job_id, attempt, checkpoint, conn)

    def on_term(signum: int, frame: object) -> None:
        why = reason.value.decode()
        if not why:
            # Not from the worker (which names its reason first) but, say, a SIGTERM to
            # the whole process group: the worker decides what happens to this job.
            return
        if why == "shutdown":
            ctx.stopping.set(why)
        ctx.cancelled.set(why)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides, not Ctrl-C
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHILD_SIGNALS)  # blocked by the parent
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        fn: Callable[..., Any] = getattr(target, "fn", target)
        result = fn(ctx, **args)
        conn.send(("result", result))
    except Fail as exc:
        conn.send(("error", "fail", str(exc), None))
    except Retry as exc:
        conn.send(("error", "retry", str(exc), exc.delay))
    except Cancelled as exc:
        conn.send(("error", "cancelled", str(exc), None))
    except BaseException as exc:
        conn.send(("error", "other", "".join(traceback.format_exception(exc))[-4000:], None))
    finally:
        conn.close()


class HookedHandle:
    """A handler started inside the application's execution hooks: ``future`` is the
    hooks' chain, and the handler (any executor) starts when the innermost calls on, so
    what the hooks set in the context (a current span) is the handler's too."""

    def __init__(
        self,
        hooks: Hooks,
        start: Callable[[], Handle],
        ctx: JobContext,
        on_start: Callable[[Handle], None] | None = None,
    ) -> None:
        self.inner: Handle | None = None

        async def handler() -> Any:
            self.inner = start()
            if on_start is not None:
                on_start(self.inner)
            return await self.inner.future

        self.future: asyncio.Future[Any] = asyncio.ensure_future(hooks.execute(ctx, handler))

    @property
    def stopped_by(self) -> str | None:
        """How the worker ended the handler, as its executor says."""
        return self.inner.stopped_by if self.inner is not None else self._stopped_by

    @stopped_by.setter
    def stopped_by(self, value: str | None) -> None:
        if self.inner is not None:
            self.inner.stopped_by = value
        self._stopped_by = value

    _stopped_by: str | None = None

    @property
    def abandon_after(self) -> float:
        """As the executor's."""
        return self.inner.abandon_after if self.inner is not None else self._abandon_after

    @abandon_after.setter
    def abandon_after(self, value: float) -> None:
        self._abandon_after = value

    _abandon_after: float = 0.0

    def stop(self, force: bool) -> None:
        if self.inner is None:
            self._stopped_by = "task_cancelled"
            self.future.cancel()  # the hooks had not started the handler yet
        else:
            self.inner.stop(force)

    def withdraw(self) -> bool:
        return self.inner.withdraw() if self.inner is not None else False


def start_handler(
    task: Task,
    ctx: JobContext,
    threads: ThreadPoolExecutor,
    *,
    grace: float,
    kill_timeout: float,
    hooks: Hooks | None = None,
    on_start: Callable[[Handle], None] | None = None,
    on_signal: Callable[[str, int], None] | None = None,
) -> Handle:
    """Start ``task``'s handler for ``ctx.job``, inside ``hooks`` when any wraps
    execution; ``on_start`` is told of the executor's handle once the handler starts,
    ``on_signal`` of each signal a process handler is sent."""
    if hooks is not None and hooks.wraps_execution:
        return HookedHandle(
            hooks,
            lambda: start_handler(
                task, ctx, threads, grace=grace, kill_timeout=kill_timeout, on_signal=on_signal
            ),
            ctx,
            on_start,
        )
    handle: Handle
    if task.executor == "async":
        handle = AsyncHandle(task, ctx, grace)
    elif task.executor == "thread":
        handle = ThreadHandle(task, ctx, threads)
    else:
        handle = ProcessHandle(task, ctx, kill_timeout, on_signal)
    if on_start is not None:
        on_start(handle)
    return handle


def thread_of(handle: Handle | None) -> concurrent.futures.Future[Any] | None:
    """The pool thread's future of a thread handler (``None`` for other executors, or
    before a hooked handler started)."""
    if isinstance(handle, HookedHandle):
        handle = handle.inner
    return handle.thread if isinstance(handle, ThreadHandle) else None
