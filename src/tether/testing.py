"""Testing helpers: an in-memory database, running jobs in-process, calling handlers.

- ``App("sqlite://:memory:")`` (:data:`MEMORY_URL`): an in-memory database of the App's
  own, shared by all its stores. Jobs go through the real state machine.
- ``await app.run_until_idle()`` / ``app.run_until_idle_sync()``: run every due job in
  this process until none is left; returns the jobs that ran, as they ended.
- ``await task.call(**args)``: run a handler directly with a :class:`TestContext`, or
  ``await ctx.run(task, **args)`` with one you made, to set its checkpoint, cancel it and
  read its checkpoints, progress, artifacts and spawned children; its durable steps run
  in memory (``steps`` seeds what an earlier attempt finished, ``signals`` what was
  sent; ``steps_run`` and ``sleeps`` record what this run did).
- the pytest fixture ``tether_app``: a fresh in-memory App for each test (registered as
  a pytest plugin when tether is installed; otherwise add
  ``pytest_plugins = ["tether.testing"]`` to your ``conftest.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from typing_extensions import ParamSpec, TypeVar

from tether import logcapture
from tether.config import AppConfig
from tether.context import CURRENT, JobContext, SyncJobContext
from tether.durable import Steps
from tether.errors import InvalidJobError
from tether.job import JSON, Job, StepInfo, WaitResult
from tether.joblog import PendingLine
from tether.states import JobState
from tether.store import MEMORY_URL

if TYPE_CHECKING:
    from tether.app import App
    from tether.task import Task

__all__ = ["MEMORY_URL", "TestContext", "tether_app"]

P = ParamSpec("P", default=...)
R = TypeVar("R", default=Any)

_child_ids = itertools.count(1)


def _job(task: str, args: dict[str, JSON], **fields: Any) -> Job:
    now = datetime.now(UTC)
    base: dict[str, Any] = {
        "id": 0,
        "task": task,
        "args": args,
        "queue": "default",
        "priority": 0,
        "key": None,
        "state": JobState.RUNNING,
        "attempt": 1,
        "max_attempts": 1,
        "timeout": None,
        "run_at": now,
        "created_at": now,
        "started_at": now,
        "finished_at": None,
        "worker_id": None,
        "lease_token": 1,
        "lease_expires_at": None,
        "heartbeat_at": None,
        "cancel_requested_at": None,
        "cancel_reason": None,
        "cancel_force": False,
        "checkpoint": None,
        "progress_current": None,
        "progress_total": None,
        "result": None,
        "error": None,
        "owner": None,
        "idempotency_key": None,
    }
    base.update(fields)
    return Job(**base)


class TestContext(JobContext):
    """A job context that keeps in memory what the handler does with it.

    ``checkpoint``, ``attempt``, ``phase`` and ``budget`` set what the handler sees, as
    if an earlier attempt had run. Afterwards ``checkpoints`` lists every checkpoint
    saved, ``progress`` and ``usage`` hold the last reported, ``artifacts`` the saved
    artifacts, ``spawned`` the children as ``(task name, args)`` and ``logs`` the lines
    of the job's own log (``ctx.log``, and the ``logging`` module inside the handler),
    as :class:`~tether.joblog.PendingLine` (``level``, ``message``). :meth:`cancel`
    (before or during the run) raises the cancel signal as a cancel request would.
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        *,
        checkpoint: JSON | None = None,
        attempt: int = 1,
        phase: str | None = None,
        budget: int | None = None,
        steps: dict[str, JSON] | None = None,
        signals: dict[str, JSON] | None = None,
        max_payload_bytes: int = AppConfig.max_payload_bytes,
        max_artifact_bytes: int = AppConfig.max_artifact_bytes,
    ) -> None:
        #: The durable steps this run ran (their names, in order), and its sleeps.
        self.steps_run: list[str] = []
        self.sleeps: list[float] = []
        self._memory = _MemorySteps(self, steps or {}, signals or {})
        self.checkpoints: list[JSON] = []
        self.artifacts: dict[str, bytes] = {}
        self.logs: list[PendingLine] = []
        self.spawned: list[tuple[str, dict[str, JSON]]] = []
        self._children_jobs: list[Job] = []
        self._budget = budget
        self._seed = {"checkpoint": checkpoint, "attempt": attempt, "phase": phase}
        super().__init__(
            _job("", {}, **self._seed, budget=budget),
            save=self._record_checkpoint,
            save_artifact=self._record_artifact,
            on_lease_lost=lambda: self.cancelled.set("lease_lost"),
            on_usage=self._record_usage,
            spawn=self._record_spawn,
            children=self._list_children,
            max_payload_bytes=max_payload_bytes,
            max_artifact_bytes=max_artifact_bytes,
            threaded=True,
            write_log=lambda _job, _token, line: self.logs.append(line),
        )
        self._steps = self._memory.for_job(self.job, max_payload_bytes)

    def cancel(self, reason: str = "cancel") -> None:
        """Ask the handler to stop, as a cancel (or ``pause``) request does."""
        self.cancelled.set(reason)

    async def run(self, task: Task[P, R], *args: P.args, **kwargs: P.kwargs) -> Any:
        """Run ``task``'s handler here with this context and return what it returns.

        The arguments are checked, stored and converted as for a real job. A plain
        ``def`` handler runs in a thread with the blocking context. Exceptions
        (:class:`~tether.Cancelled`, :class:`~tether.Retry`...) propagate.
        """
        named = task.arguments.bind(args, kwargs)
        stored = task.arguments.for_storage(named)
        self.job = _job(task.name, stored, **self._seed, budget=self._budget)
        self._steps = self._memory.for_job(self.job, self._max_payload)
        call_args = task.arguments.for_call(stored)
        fn: Callable[..., Any] = task.fn
        logcapture.install()  # the logging module's records land in ``logs``, as in a worker
        try:
            if task.executor == "async":
                current = CURRENT.set(self)  # for @tether.step functions, as a worker does
                try:
                    return await fn(self, **call_args)
                finally:
                    CURRENT.reset(current)
            loop = asyncio.get_running_loop()
            sync_ctx = SyncJobContext(self, loop)
            context = contextvars.copy_context()
            context.run(CURRENT.set, sync_ctx)
            return await loop.run_in_executor(None, lambda: context.run(fn, sync_ctx, **call_args))
        finally:
            logcapture.uninstall()

    async def _record_checkpoint(self, encoded: str) -> bool:
        self.checkpoints.append(json.loads(encoded))
        return True

    async def _record_artifact(self, name: str, data: bytes) -> bool:
        self.artifacts[name] = data
        return True

    def _record_usage(self, usage: int) -> None:
        if self._budget is not None and usage > self._budget:
            self.cancelled.set("pause")

    async def _record_spawn(self, task: str, args: dict[str, JSON]) -> Job:
        self.spawned.append((task, args))
        child = _job(task, args, id=next(_child_ids), state=JobState.QUEUED, attempt=0)
        self._children_jobs.append(child)
        return child

    async def _list_children(self) -> list[Job]:
        return list(self._children_jobs)


class _MemorySteps:
    """A :class:`TestContext`'s durable steps, kept in memory: a step runs unless it was
    seeded, a sleep is noted and returns, a wait returns its seeded signal (or, with a
    timeout, raises :class:`~tether.errors.SignalTimeoutError`). Fenced transactions
    need a database: test them with an App (``tether_app``)."""

    def __init__(self, ctx: TestContext, done: dict[str, JSON], signals: dict[str, JSON]) -> None:
        self._ctx = ctx
        self._done = {name: json.dumps(value) for name, value in done.items()}
        self._signals = signals

    def for_job(self, job: Job, max_payload_bytes: int) -> Steps:
        return Steps(
            job,
            self,  # type: ignore[arg-type]  # the StepStore calls Steps makes
            worker_id="test",
            url="",
            connections=None,
            on_lease_lost=lambda: self._ctx.cancelled.set("lease_lost"),
            usage=lambda: self._ctx.usage,
            max_payload_bytes=max_payload_bytes,
            stop_requested=lambda: self._ctx.cancelled.reason if self._ctx.cancelled else None,
        )

    async def steps(self, job_id: int) -> list[StepInfo]:
        now = datetime.now(UTC)
        return [
            StepInfo(job_id, name, "step", "done", json.loads(v), 1, now, now, None)
            for name, v in self._done.items()
        ]

    async def save_step(
        self, job_id: int, lease_token: int, name: str, result_json: str, **_: Any
    ) -> bool:
        self._ctx.steps_run.append(name)
        self._done[name] = result_json
        return True

    async def wait(
        self,
        worker_id: str,
        job_id: int,
        lease_token: int,
        name: str,
        *,
        signal: str | None = None,
        seconds: float | None = None,
        reason: str,
        usage: int | None = None,
    ) -> WaitResult:
        if signal is None:
            self._ctx.sleeps.append(seconds or 0.0)
            return WaitResult("done")
        if signal in self._signals:
            return WaitResult("done", json.dumps(self._signals[signal]))
        if seconds is not None:
            return WaitResult("timed_out")
        raise InvalidJobError(
            f"the handler waits for signal {signal!r} with no timeout: give it to "
            "TestContext(signals={...})"
        )


def _fixture() -> Any:
    import pytest

    @pytest.fixture
    def tether_app() -> Iterator[App]:
        """A fresh App on an in-memory database of its own, for one test."""
        from tether.app import App

        app = App(MEMORY_URL)
        yield app
        app.run_sync(app.close())

    return tether_app


with contextlib.suppress(ImportError):  # without pytest, the rest still works
    tether_app = _fixture()
