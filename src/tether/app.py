"""The App: the task registry, enqueueing, waiting and cancelling, and the sync edge;
the rest of the API through its facades (:mod:`tether.facades`)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import weakref
from collections.abc import (
    AsyncGenerator,
    Callable,
    Coroutine,
    Iterable,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, overload

from tether import hints as h
from tether import names
from tether.audit import audited, local_actor
from tether.cancellation import CancellationResult
from tether.cancellation.tally import STOPPED_BY
from tether.config import DEFAULT_DATABASE_URL, AppConfig, RetryPolicy, WorkerConfig
from tether.errors import ConfigError, JobNotFoundError, WaitTimeoutError
from tether.facades import Admin, Cancellations, Durable, Jobs, Queues, Schedules
from tether.facades.base import job_target
from tether.facades.cancellations import service as cancellation_service
from tether.hooks import Hook, Hooks, OutcomeEvent
from tether.job import JSON, Job, JobFilter, NewJob
from tether.new_job import checked_meta, new_job
from tether.periodic import DEFAULT_GRACE, Missed
from tether.portal import Portal
from tether.schema import ensure_schema
from tether.states import JobState
from tether.store import (
    MEMORY_URL,
    Store,
    caller_store,
    create_store,
    memory_url,
    parse_sqlite_path,
)
from tether.task import EnqueueOptions, Executor, Task, is_async, module_name
from tether.workflow import Workflow

if TYPE_CHECKING:
    # The worker refers to App in turn: type-only here, imported by worker() when called.
    from tether.worker import Worker

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
DEFAULT_CANCEL_WAIT = 30.0


def _name(task: str | Task) -> str:
    return task.name if isinstance(task, Task) else task


def _connection(args: dict[str, Any]) -> object | None:
    """The caller's connection among an enqueue's arguments, if it gave one."""
    opts = args.get("opts")
    if isinstance(opts, EnqueueOptions):
        return opts.connection
    given: object | None = args.get("connection") or args.get("options", {}).get("connection")
    return given


def _span(jobs: Sequence[Job]) -> str:
    ids = [j.id for j in jobs]
    return f"jobs:{min(ids)}..{max(ids)} ({len(ids)})" if ids else "jobs: none"


#: How a worker says it stopped a handler; the cancelled jobs stopped so are told of by
#: their worker, not by the App that cancelled them.
_WORKER_STOPPED = STOPPED_BY | {"cooperative"}


class App:
    """A tether application: the tasks it knows and the database it uses.

    ``url`` defaults to ``$TETHER_DATABASE_URL``, then ``sqlite:///tether.db``;
    ``sqlite://:memory:`` gives the App an in-memory database of its own (for tests). The
    schema is migrated on first use unless ``config.auto_migrate`` is off; then a
    database that lacks migrations this code needs is refused with
    :class:`~tether.errors.SchemaVersionError`, and one newer than this code is used
    with a warning.

    The App enqueues, waits and cancels; the rest of the API is in its facades:
    :attr:`jobs` (read and steer jobs), :attr:`queues` (queues, keys, rate limits),
    :attr:`cancellations` (their records), :attr:`schedules` (periodic jobs) and
    :attr:`admin` (schema, migrations, pruning, the leader, workers).

    Every mutation made through the App or its facades (enqueue, cancel, pause, resume,
    retry, delete, queue pause and resume, key configuration...) leaves an audit row
    naming ``actor`` (default ``python:<OS user>``; the attribute may be set later too).

    ``hooks`` run the application's own code around enqueues and attempts, and on
    outcomes (:class:`~tether.Hook`); a worker of this App runs them too.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        config: AppConfig | None = None,
        actor: str | None = None,
        hooks: Sequence[Hook] = (),
    ) -> None:
        self.url = url or os.environ.get("TETHER_DATABASE_URL") or DEFAULT_DATABASE_URL
        self.config = config or AppConfig()
        self._memory: object | None = None
        if self.url == MEMORY_URL:
            # Tests: a database of this App's own, shared by its stores on every loop,
            # which lives as long as the App holds it.
            from tether.store.sqlite import MemoryDatabase

            self.url = memory_url()
            self._memory = MemoryDatabase(parse_sqlite_path(self.url))
        self.actor = actor or local_actor("python")
        #: The application's hooks (see :mod:`tether.hooks`).
        self.hooks = Hooks(hooks)
        create_store(self.url, self.config.store)  # validates the URL now, not at first use
        self.tasks: dict[str, Task] = {}
        self.resources: dict[str, int] = {}
        self._stores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Store] = (
            weakref.WeakKeyDictionary()
        )
        self._store_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        # One closer per loop store: an async generator parked at its ``yield``, which the
        # loop finalizes (closing the store) when it shuts down, as ``asyncio.run`` does.
        self._closers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncGenerator[None, None]
        ] = weakref.WeakKeyDictionary()
        self._portal = Portal()
        #: Reading and steering jobs.
        self.jobs = Jobs(self)
        #: Queues, concurrency keys and rate limits.
        self.queues = Queues(self)
        #: Cancellation records.
        self.cancellations = Cancellations(self)
        #: Declared and recorded schedules.
        self.schedules = Schedules(self)
        #: Durable steps, and signals to the jobs that wait for them.
        self.durable = Durable(self)
        #: Schema, migrations, retention, the leader and workers.
        self.admin = Admin(self)

    def __repr__(self) -> str:
        return f"<tether.App {self.url} tasks={sorted(self.tasks)}>"

    # -- tasks ---------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[Concatenate[Any, P], R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        executor: Executor | None = None,
        priority: int = 0,
        resources: Sequence[str] = (),
    ) -> Callable[[Callable[Concatenate[Any, P], R]], Task[P, R]]: ...

    def task(  # type: ignore[misc]  # mypy misreads the positional-only fn
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        executor: Executor | None = None,
        priority: int = 0,
        resources: Sequence[str] = (),
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a handler. ``async def`` handlers run on the event loop, plain
        ``def`` handlers in a thread. The handler's first argument is the job context;
        the job's JSON args come as keyword arguments. ``executor="process"`` runs a
        module-level ``def`` in a child process that can be killed; ``resources`` names
        pools declared with :meth:`resource` whose slots the job holds while it runs."""

        resource_names = [("resource", r) for r in resources]

        def register(fn: Callable[..., Any]) -> Task:
            task_name = name or f"{module_name(fn)}.{fn.__qualname__}"
            for kind, named in (("task", task_name), ("queue", queue), *resource_names):
                if named is not None:
                    names.check_config(kind, named)
            if task_name in self.tasks:
                raise ConfigError(f"a task named {task_name!r} is already registered")
            task = Task(
                self,
                fn,
                name=task_name,
                queue=queue or self.config.default_queue,
                max_attempts=(
                    max_attempts if max_attempts is not None else self.config.default_max_attempts
                ),
                timeout=timeout,
                retry=retry or self.config.retry,
                executor=executor or ("async" if is_async(fn) else "thread"),
                priority=priority,
                resources=tuple(resources),
            )
            self.tasks[task_name] = task
            return task

        return register(fn) if fn is not None else register

    def resource(self, name: str, capacity: int) -> None:
        """Declare a pool of ``capacity`` slots that tasks can require."""
        names.check_config("resource", name)
        if capacity < 1:
            raise ConfigError(f"resource {name!r}: capacity must be at least 1")
        self.resources[name] = capacity

    # -- the store -----------------------------------------------------------------------

    async def store(self) -> Store:
        """This event loop's connected (and, by default, migrated) store."""
        loop = asyncio.get_running_loop()
        store = self._stores.get(loop)
        if store is not None:
            return store
        lock = self._store_locks.setdefault(loop, asyncio.Lock())
        async with lock:
            store = self._stores.get(loop)
            if store is None:
                store = create_store(self.url, self.config.store)
                try:
                    await store.open()
                    await ensure_schema(store, migrate=self.config.auto_migrate)
                except BaseException:
                    await store.close()
                    raise
                for name, capacity in self.resources.items():
                    await store.define_limit(f"resource:{name}", "resource", capacity, False)
                self._stores[loop] = store
                closer = self._close_with_loop(loop, store)
                # The first step registers the generator with the running loop, whose
                # shutdown (asyncio.run, asgiref's async_to_sync) closes it; the loop only
                # keeps a weak reference, hence ours.
                await anext(closer)
                self._closers[loop] = closer
        return store

    async def _close_with_loop(
        self, loop: asyncio.AbstractEventLoop, store: Store
    ) -> AsyncGenerator[None, None]:
        """Hold ``store`` until its loop shuts down (or :meth:`close`), then close it.

        Without this, every ``asyncio.run(app.enqueue(...))`` would leave its store's
        connections open: the loop is gone, but nothing closes what was bound to it.
        """
        try:
            yield
        finally:
            if self._stores.get(loop) is store:
                del self._stores[loop]
            self._closers.pop(loop, None)
            await store.close()

    async def close(self) -> None:
        """Close this loop's store (a loop that shuts down closes its own anyway)."""
        closer = self._closers.pop(asyncio.get_running_loop(), None)
        if closer is not None:
            await closer.aclose()

    # -- enqueue -------------------------------------------------------------------------

    def _new_job(
        self, task_name: str, args: dict[str, JSON] | None, opts: EnqueueOptions
    ) -> NewJob:
        return new_job(
            self.tasks, task_name, args, opts, max_payload_bytes=self.config.max_payload_bytes
        )

    @audited(
        "job.enqueue",
        lambda a: f"task:{_name(a['task'])}",
        done=lambda j: f"job:{j.id}",
        connection=_connection,
    )
    async def enqueue(
        self,
        task: str | Task,
        args: dict[str, JSON] | None = None,
        opts: EnqueueOptions | None = None,
        **options: Any,
    ) -> Job:
        """Enqueue one job. ``options`` are those of :class:`EnqueueOptions`.

        With an ``idempotency_key`` that already exists, the existing job is returned
        as it is and nothing new is created; the rest of the request is not checked
        against the database again (a dependency cancelled since then does not make a
        retried request fail), so a retry gets the first request's answer. With
        ``connection`` (the caller's open transaction), the job commits or rolls back
        with the caller's writes.
        """
        opts = opts or EnqueueOptions(**options)
        name = task.name if isinstance(task, Task) else task
        new = self._new_job(name, args, opts)
        (job,) = await self._insert([new], opts.connection)
        return job

    @audited("job.enqueue", lambda a: "jobs", done=lambda jobs: _span(jobs), connection=_connection)
    async def enqueue_many(
        self, jobs: Iterable[tuple[str | Task, dict[str, JSON]]], **options: Any
    ) -> list[Job]:
        """Enqueue many jobs in one transaction: all of them, or none if one is invalid."""
        opts = EnqueueOptions(**options)
        new = [self._new_job(t.name if isinstance(t, Task) else t, args, opts) for t, args in jobs]
        return await self._insert(new, opts.connection)

    @audited(
        "workflow.enqueue",
        lambda a: "jobs",
        done=lambda made: _span(list(made.values())),
        connection=_connection,
    )
    async def enqueue_workflow(
        self, workflow: Workflow, *, connection: object | None = None
    ) -> dict[str, Job]:
        """Enqueue every job of ``workflow`` in one transaction; returns them by name.
        With ``connection``, that transaction is the caller's.

        A cycle, an unknown name or an unknown or dead dependency id is a clear
        :class:`InvalidJobError`, and nothing is written.
        """
        nodes = workflow.order()
        position = {node.name: i for i, node in enumerate(nodes)}
        new = []
        for node in nodes:
            built = self._new_job(node.task, node.args, EnqueueOptions(**node.options))
            new.append(
                dataclasses.replace(
                    built,
                    depends_on=tuple(d for d in node.depends_on if isinstance(d, int)),
                    depends_on_batch=tuple(
                        position[d] for d in node.depends_on if isinstance(d, str)
                    ),
                )
            )
        jobs = await self._insert(new, connection)
        return {node.name: job for node, job in zip(nodes, jobs, strict=True)}

    async def _insert(self, new: list[NewJob], connection: object | None) -> list[Job]:
        async def insert(checked: list[NewJob]) -> list[Job]:
            if connection is None:
                store = await self.store()
                return await store.enqueue(checked)
            # The app's own store is not touched: on SQLite its connection would wait
            # for the write lock the caller holds.
            return await caller_store(self.url, connection).enqueue(checked)

        return await self.hooks.enqueue(new, insert, checked_meta)

    def enqueue_sync(
        self,
        task: str | Task,
        args: dict[str, JSON] | None = None,
        opts: EnqueueOptions | None = None,
        **options: Any,
    ) -> Job:
        """Blocking :meth:`enqueue` for sync code."""
        opts = opts or EnqueueOptions(**options)
        if opts.connection is not None:
            # The caller's connection stays in the caller's thread (sqlite3 insists).
            return asyncio.run(self.enqueue(task, args, opts))
        return self.run_sync(self.enqueue(task, args, opts))

    # -- reading -------------------------------------------------------------------------

    async def get(self, job_id: int) -> Job:
        """The job with this id; raises :class:`JobNotFoundError`."""
        store = await self.store()
        job = await store.get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return job

    # -- control -------------------------------------------------------------------------

    @audited("job.cancel", job_target)
    async def cancel(
        self,
        job_id: int,
        *,
        reason: str | None = None,
        force: bool = False,
        cascade: bool = True,
        wait: float = DEFAULT_CANCEL_WAIT,
        actor: str | None = None,
        request_id: str | None = None,
    ) -> CancellationResult:
        """Cancel a job and leave a record of how.

        A job that is not running is cancelled at once. A running job is asked to stop
        (``force`` skips the grace period and kills a process handler) and this call
        waits up to ``wait`` seconds for its worker to stop it. Repeated or concurrent
        calls for the same job (or with the same ``request_id``) share one record.
        Cancelling a job that already succeeded raises :class:`IllegalTransitionError`
        and changes nothing; a paused job over its budget fails instead.
        """
        service = await cancellation_service(self)
        result = await service.cancel(
            job_id,
            reason=reason or "cancelled by request",
            force=force,
            cascade=cascade,
            wait=wait,
            actor=actor,
            request_id=request_id,
        )
        if self.hooks.hears_outcomes and result.outcome == "cancelled":
            await self._tell_cancelled(result)
        return result

    async def _tell_cancelled(self, result: CancellationResult) -> None:
        """``cancelled`` outcomes for the jobs this cancellation ended before they ran
        (the worker that stopped a running one tells of it)."""
        store = await self.store()
        ids = tuple(result.tasks_cancelled) or (result.job_id,)
        for job in await store.list_jobs(JobFilter(ids=ids, limit=len(ids))):
            # A worker that stopped a job says how (``stopped_by``), and tells of it.
            if job.state is JobState.CANCELLED and job.stopped_by not in _WORKER_STOPPED:
                await self.hooks.outcome(
                    OutcomeEvent(
                        "cancelled",
                        job,
                        reason=job.cancel_reason,
                        cancellation_id=result.cancellation_id,
                    )
                )

    async def wait(self, job_id: int, timeout: float | None = None) -> Job:
        """Wait until the job is succeeded, failed or cancelled; return it.

        Raises :class:`WaitTimeoutError` if ``timeout`` seconds pass first.
        """
        return await self._wait_for(job_id, lambda j: j.is_terminal, timeout)

    async def _wait_for(
        self, job_id: int, done: Callable[[Job], bool], timeout: float | None
    ) -> Job:
        await self.admin.listen()
        store = await self.store()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        # Subscribe before reading, so a change between the read and the wait wakes us.
        with store.hints.subscribe(h.CHANGED, [str(job_id)]) as sub:
            while True:
                job = await store.get(job_id)
                if job is None:
                    raise JobNotFoundError(job_id)
                if done(job):
                    return job
                step = self.config.wait_poll_interval
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        raise WaitTimeoutError(
                            f"job {job_id} is still {job.display_state} after {timeout}s"
                        )
                    step = min(step, left)
                await sub.get(step)

    # -- sync edge -----------------------------------------------------------------------

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one of this App's coroutines from sync code."""
        return self._portal.call(coro)

    def close_sync(self) -> None:
        """Close the store that sync callers share, and its background loop (a later
        sync call opens them again)."""
        self.run_sync(self.close())
        self._portal.close()

    def get_sync(self, job_id: int) -> Job:
        """Blocking :meth:`get`."""
        return self.run_sync(self.get(job_id))

    def cancel_sync(self, job_id: int, **kwargs: Any) -> CancellationResult:
        """Blocking :meth:`cancel`."""
        return self.run_sync(self.cancel(job_id, **kwargs))

    def wait_sync(self, job_id: int, timeout: float | None = None) -> Job:
        """Blocking :meth:`wait`."""
        return self.run_sync(self.wait(job_id, timeout))

    # -- workers -------------------------------------------------------------------------

    def worker(self, config: WorkerConfig | None = None, **settings: Any) -> Worker:
        """A :class:`~tether.worker.Worker` for this app (``settings`` as WorkerConfig)."""
        from tether.worker import Worker

        return Worker(self, config or WorkerConfig(**settings))

    async def run_until_idle(
        self, *, queues: Sequence[str] | None = None, timeout: float | None = None
    ) -> list[Job]:
        """Run every due job in this process until none is left; return the jobs that ran,
        as they ended. For tests and scripts; see :func:`tether.drain.run_until_idle`."""
        from tether.drain import run_until_idle

        return await run_until_idle(self, queues=tuple(queues) if queues else None, timeout=timeout)

    def run_until_idle_sync(
        self, *, queues: Sequence[str] | None = None, timeout: float | None = None
    ) -> list[Job]:
        """Blocking :meth:`run_until_idle`."""
        return self.run_sync(self.run_until_idle(queues=queues, timeout=timeout))

    # -- periodic schedules ---------------------------------------------------------------

    def periodic(
        self,
        *,
        cron: str,
        timezone: str = "UTC",
        args: dict[str, JSON] | None = None,
        name: str | None = None,
        missed: Missed = "none",
        jitter: float = 0.0,
        grace: float = DEFAULT_GRACE,
        **task_options: Any,
    ) -> Callable[[Callable[..., Any]], Task]:
        """Register a task (``task_options`` as for :meth:`task`) and enqueue it once per
        tick of ``cron`` in ``timezone``, with ``args``, however many workers run.

        The schedule is named after the task unless ``name`` is given. ``missed`` says
        what happens to ticks that passed while no worker ran: ``"none"`` skips them
        (a tick up to ``grace`` seconds late still runs), ``"latest"`` runs the latest
        one. ``jitter`` delays each tick's job by a random 0 to ``jitter`` seconds.
        """

        def register(fn: Callable[..., Any]) -> Task:
            task = self.task(**task_options)(fn)
            self.schedules.declare(
                task,
                cron=cron,
                timezone=timezone,
                args=args,
                name=name,
                missed=missed,
                jitter=jitter,
                grace=grace,
            )
            return task

        return register
