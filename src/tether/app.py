"""The App: task registry, enqueue, and every way to read or steer jobs."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
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
from tether import names, payload, serving
from tether.audit import audited, local_actor
from tether.cancellation import (
    CancellationRecord,
    CancellationResult,
    CancellationService,
    record_from_row,
)
from tether.config import DEFAULT_DATABASE_URL, AppConfig, RetryPolicy, WorkerConfig
from tether.errors import (
    ConfigError,
    IllegalTransitionError,
    InvalidJobError,
    JobNotFoundError,
    PayloadTooLargeError,
    ScheduleNotFoundError,
    UnknownTaskError,
    WaitTimeoutError,
)
from tether.feed import FeedFilter, follow
from tether.job import (
    JSON,
    ArtifactInfo,
    FeedEvent,
    Job,
    JobEvent,
    JobFilter,
    LimitInfo,
    NewJob,
    QueueInfo,
    RateLimitInfo,
    WorkerInfo,
)
from tether.ops import MAINTENANCE, LeaderInfo, PruneReport, ScheduleDeclaration, ScheduleRow
from tether.periodic import DEFAULT_GRACE, Missed, Schedule
from tether.portal import Portal
from tether.schema import ensure_schema
from tether.states import TERMINAL, JobState
from tether.store import (
    MEMORY_URL,
    Store,
    caller_store,
    create_store,
    memory_url,
    parse_sqlite_path,
)
from tether.store.base import shipped_versions
from tether.task import EnqueueOptions, Executor, Task, is_async, module_name
from tether.workflow import Workflow

if TYPE_CHECKING:
    # The worker refers to App in turn: type-only here, imported by worker() when called.
    from tether.worker import Worker

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
DEFAULT_CANCEL_WAIT = 30.0


def _job_target(args: dict[str, Any]) -> str:
    return f"job:{args['job_id']}"


def _queue_target(args: dict[str, Any]) -> str:
    return f"queue:{args['name']}"


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


class App:
    """A tether application: the tasks it knows and the database it uses.

    ``url`` defaults to ``$TETHER_DATABASE_URL``, then ``sqlite:///tether.db``;
    ``sqlite://:memory:`` gives the App an in-memory database of its own (for tests). The
    schema is migrated on first use unless ``config.auto_migrate`` is off; then a
    database that lacks migrations this code needs is refused with
    :class:`~tether.errors.SchemaVersionError`, and one newer than this code is used
    with a warning.

    Every mutation made through the App (enqueue, cancel, pause, resume, retry, delete,
    queue pause and resume, key configuration) leaves an audit row naming ``actor``
    (default ``python:<OS user>``; the attribute may be set later too).
    """

    def __init__(
        self, url: str | None = None, *, config: AppConfig | None = None, actor: str | None = None
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
        create_store(self.url, self.config.store)  # validates the URL now, not at first use
        self.tasks: dict[str, Task] = {}
        self.resources: dict[str, int] = {}
        self.schedules: dict[str, Schedule] = {}
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

    async def listen(self) -> None:
        """Connect this event loop's store now and, on PostgreSQL, listen for its
        notifications, so waits and feeds wake as soon as a job changes."""
        store = await self.store()
        await store.listen()

    @staticmethod
    def sqlite_file(url: str) -> str | None:
        """The file a ``sqlite:`` database URL names (``None`` for PostgreSQL); a
        malformed or unsupported URL raises :class:`~tether.errors.ConfigError`."""
        create_store(url)
        return parse_sqlite_path(url) if url.startswith("sqlite:") else None

    async def schema_version(self) -> int:
        """The newest migration applied to the database (connecting first)."""
        return await (await self.store()).schema_version()

    async def missing_migrations(self) -> builtins.list[int]:
        """The migrations this code ships that the database lacks (gaps included)."""
        applied = await (await self.store()).applied_migrations()
        return sorted(shipped_versions(self.url) - applied)

    def expected_schema_version(self) -> int:
        """The newest migration this code ships for the App's database."""
        return max(shipped_versions(self.url))

    async def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied (warns if the
        database is newer than this code)."""
        store = create_store(self.url, self.config.store)
        try:
            await store.open()
            return await ensure_schema(store, migrate=True)
        finally:
            await store.close()

    async def close(self) -> None:
        """Close this loop's store (a loop that shuts down closes its own anyway)."""
        closer = self._closers.pop(asyncio.get_running_loop(), None)
        if closer is not None:
            await closer.aclose()

    # -- enqueue -------------------------------------------------------------------------

    def new_job(self, task_name: str, args: dict[str, JSON] | None, opts: EnqueueOptions) -> NewJob:
        """Validate one job's input and build what the store inserts (nothing is written)."""
        task = self.tasks.get(task_name)
        if task is None:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UnknownTaskError(f"unknown task {task_name!r} (registered: {known})")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise InvalidJobError(f"args must be a JSON object (a dict), got {type(args).__name__}")
        args = task.arguments.for_storage(args)
        try:
            args_json = payload.encode(args)
        except ValueError as exc:
            raise InvalidJobError(f"args of {task_name!r} cannot be stored: {exc}") from exc
        size = len(args_json.encode())
        if size > self.config.max_payload_bytes:
            raise PayloadTooLargeError(
                f"args of {task_name!r} are {size} bytes; the limit is "
                f"{self.config.max_payload_bytes}"
            )
        max_attempts = opts.max_attempts if opts.max_attempts is not None else task.max_attempts
        if max_attempts < 1:
            raise InvalidJobError("max_attempts must be at least 1")
        for kind, named in (("queue", opts.queue), ("key", opts.key)):
            if named is not None:
                names.check(kind, named)
        try:
            idempotency_key = payload.scoped_key(opts.owner, opts.idempotency_key)
        except ValueError as exc:
            raise InvalidJobError(str(exc)) from None
        timeout = opts.timeout if opts.timeout is not None else task.timeout
        if timeout is not None and timeout <= 0:
            raise InvalidJobError("timeout must be positive")
        if opts.delay < 0:
            raise InvalidJobError("delay must not be negative")
        if opts.run_at is not None:
            if opts.delay:
                raise InvalidJobError("give delay or run_at, not both")
            if opts.run_at.tzinfo is None or opts.run_at.utcoffset() is None:
                raise InvalidJobError("run_at must be timezone-aware (for example in UTC)")
        if opts.unique_for is not None:
            if opts.idempotency_key is None:
                raise InvalidJobError("unique_for needs an idempotency_key")
            if opts.unique_for <= 0:
                raise InvalidJobError(f"unique_for must be positive, got {opts.unique_for}")
        if opts.budget is not None and opts.budget <= 0:
            raise InvalidJobError(f"budget must be positive, got {opts.budget}")
        limits = ([f"key:{opts.key}"] if opts.key is not None else []) + [
            f"resource:{r}" for r in task.resources
        ]
        return NewJob(
            task=task_name,
            args_json=args_json,
            queue=opts.queue or task.queue,
            priority=opts.priority if opts.priority is not None else task.priority,
            key=opts.key,
            max_attempts=max_attempts,
            timeout=timeout,
            delay=opts.delay,
            owner=opts.owner,
            idempotency_key=idempotency_key,
            budget=opts.budget,
            limits=tuple(limits),
            depends_on=tuple(opts.depends_on),
            run_at=opts.run_at,
            unique_for=opts.unique_for,
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
        new = self.new_job(name, args, opts)
        (job,) = await self._insert([new], opts.connection)
        return job

    @audited("job.enqueue", lambda a: "jobs", done=lambda jobs: _span(jobs), connection=_connection)
    async def enqueue_many(
        self, jobs: Iterable[tuple[str | Task, dict[str, JSON]]], **options: Any
    ) -> list[Job]:
        """Enqueue many jobs in one transaction: all of them, or none if one is invalid."""
        opts = EnqueueOptions(**options)
        new = [self.new_job(t.name if isinstance(t, Task) else t, args, opts) for t, args in jobs]
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
            built = self.new_job(node.task, node.args, EnqueueOptions(**node.options))
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

    async def _insert(
        self, new: builtins.list[NewJob], connection: object | None
    ) -> builtins.list[Job]:
        if connection is None:
            return await (await self.store()).enqueue(new)
        # The app's own store is not touched: on SQLite its connection would wait for
        # the write lock the caller holds.
        return await caller_store(self.url, connection).enqueue(new)

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
        job = await (await self.store()).get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return job

    async def list(
        self,
        *,
        state: JobState | str | Sequence[JobState | str] | None = None,
        queue: str | None = None,
        task: str | None = None,
        key: str | None = None,
        owner: str | None = None,
        worker_id: str | None = None,
        parent_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Job]:
        """Jobs, newest first, filtered."""
        states: tuple[JobState, ...] | None = None
        if state is not None:
            raw = [state] if isinstance(state, str) else list(state)
            try:
                states = tuple(JobState(s) for s in raw)
            except ValueError as exc:
                raise InvalidJobError(
                    f"unknown state in {raw!r}; states are {', '.join(JobState)}"
                ) from exc
        if limit < 1 or offset < 0:
            raise InvalidJobError("limit must be positive and offset not negative")
        if any("\x00" in (f or "") for f in (queue, task, key, owner, worker_id)):
            return []  # nothing stored holds a NUL character (PostgreSQL refuses it)
        flt = JobFilter(
            states=states,
            queue=queue,
            task=task,
            key=key,
            owner=owner,
            worker_id=worker_id,
            parent_id=parent_id,
            limit=limit,
            offset=offset,
        )
        return await (await self.store()).list_jobs(flt)

    async def events(self, job_id: int) -> builtins.list[JobEvent]:
        """The job's transitions, oldest first."""
        await self.get(job_id)
        return await (await self.store()).events(job_id)

    async def stats(self) -> dict[str, int]:
        """Number of jobs in each state, every state present."""
        counts = await (await self.store()).count_by_state()
        return {s.value: counts.get(s.value, 0) for s in JobState}

    async def workers(self) -> builtins.list[WorkerInfo]:
        """Known workers, newest first."""
        return await (await self.store()).list_workers()

    async def unserved(self) -> builtins.list[serving.Unserved]:
        """Waiting jobs that no live worker can run, by queue and task, with why."""
        store = await self.store()
        waiting = await store.waiting_by_task()
        if not waiting:
            return []
        workers = serving.live(await store.list_workers())
        found = []
        for (queue, task), n in sorted(waiting.items()):
            why = serving.reason(queue, task, workers)
            if why is not None:
                found.append(serving.Unserved(queue, task, n, why))
        return found

    async def unserved_reason(self, job: Job) -> str | None:
        """Why no live worker can run this waiting job (``None``: one can, or the job is
        not waiting to run)."""
        if job.state not in (JobState.QUEUED, JobState.RETRYING):
            return None
        workers = serving.live(await (await self.store()).list_workers())
        return serving.reason(job.queue, job.task, workers)

    # -- control -------------------------------------------------------------------------

    @audited("job.cancel", _job_target)
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
        service = await self._cancellations()
        return await service.cancel(
            job_id,
            reason=reason or "cancelled by request",
            force=force,
            cascade=cascade,
            wait=wait,
            actor=actor,
            request_id=request_id,
        )

    async def _cancellations(self) -> CancellationService:
        return CancellationService(
            await self.store(),
            self.config.wait_poll_interval,
            adopt_after=self.config.cancellation_adopt_after,
            retry=self.config.cancellation_retry,
        )

    async def wait_cancelled(self, job_id: int, timeout: float) -> tuple[bool, builtins.list[str]]:
        """Wait until the job's cancellation has finished and its job has stopped, or
        ``timeout``; return ``(success, errors)``.

        A record that settled ``partial`` because its job still ran (``cancel(wait=0)``)
        is completed as soon as the job stops, so an error that no longer holds is not
        reported. Event-driven (NOTIFY on PostgreSQL, in-process hints otherwise,
        polling as the fallback); a cancellation that already finished is answered at once.
        """
        await self.get(job_id)
        service = await self._cancellations()
        record = await service.wait_settled(job_id, timeout)
        if record is None:
            return False, [f"job {job_id} has no cancellation"]
        if not record.settled:
            return False, [f"cancellation {record.id} is still {record.status} after {timeout}s"]
        return record.status == "completed", record.errors

    async def cancellation(self, job_id: int) -> CancellationRecord | None:
        """The job's cancellation record, if it was ever cancelled by request."""
        await self.get(job_id)
        row = await (await self.store()).get_cancellation(job_id=job_id, request_id=None)
        return record_from_row(row) if row is not None else None

    async def cancellations(
        self, limit: int = 20, offset: int = 0
    ) -> builtins.list[CancellationRecord]:
        """Cancellation records, newest first."""
        rows = await (await self.store()).list_cancellations(limit=limit, offset=offset)
        return [record_from_row(r) for r in rows]

    @audited("job.pause", _job_target)
    async def pause(
        self, job_id: int, *, reason: str | None = None, actor: str | None = None
    ) -> Job:
        """Pause a job: at once if it waits to run, at its next checkpoint if running.

        A paused job keeps its checkpoint; :meth:`resume` queues it again. Pausing a job
        that is blocked or finished raises :class:`IllegalTransitionError`.
        """
        before = await self.get(job_id)
        if before.state not in (
            JobState.QUEUED,
            JobState.RETRYING,
            JobState.RUNNING,
            JobState.PAUSED,
        ):
            raise IllegalTransitionError(job_id, before.state.value, "pause")
        return await (await self.store()).request_pause(job_id, reason, actor)

    @audited("job.resume", _job_target)
    async def resume(
        self, job_id: int, *, budget: int | None = None, actor: str | None = None
    ) -> Job:
        """Queue a paused job again (optionally with a new budget); it continues from its
        checkpoint. Withdraws a pause that a running job has not acted on yet."""
        if budget is not None and budget <= 0:
            raise InvalidJobError(f"budget must be positive, got {budget}")
        before = await self.get(job_id)
        pausing = before.state is JobState.RUNNING and before.pause_requested_at is not None
        if before.state is not JobState.PAUSED and not pausing:
            raise IllegalTransitionError(job_id, before.state.value, "resume")
        return await (await self.store()).resume(job_id, budget, actor)

    @audited("job.retry", _job_target)
    async def retry(self, job_id: int, *, actor: str | None = None) -> Job:
        """Queue a failed job again with a fresh set of attempts."""
        before = await self.get(job_id)
        if before.state is not JobState.FAILED:
            raise IllegalTransitionError(job_id, before.state.value, "retry")
        return await (await self.store()).retry(job_id, actor)

    @audited("queue.pause", _queue_target)
    async def pause_queue(self, name: str, *, reason: str | None = None) -> None:
        """Stop all claims from a queue; running jobs finish."""
        names.check("queue", name)
        await (await self.store()).set_queue_paused(name, True, reason)

    @audited("queue.resume", _queue_target)
    async def resume_queue(self, name: str) -> None:
        """Let workers claim from a paused queue again."""
        names.check("queue", name)
        await (await self.store()).set_queue_paused(name, False, None)

    async def queues(self) -> builtins.list[QueueInfo]:
        """Queues with their pause flags, job counts and the waiting jobs that no live
        worker can run."""
        queues = await (await self.store()).list_queues()
        unserved: dict[str, builtins.list[serving.Unserved]] = {}
        for u in await self.unserved():
            unserved.setdefault(u.queue, []).append(u)
        return [dataclasses.replace(q, unserved=tuple(unserved.get(q.name, ()))) for q in queues]

    @audited("key.configure", lambda a: f"key:{a['key']}")
    async def configure_key(
        self, key: str, *, max_running: int = 1, block_on_hold: bool = True
    ) -> None:
        """Set how many jobs of a concurrency key may run at once, and whether a paused
        or failed job under the key blocks it (the default)."""
        names.check("key", key)
        if max_running < 1:
            raise InvalidJobError("max_running must be at least 1")
        await (await self.store()).define_limit(f"key:{key}", "key", max_running, block_on_hold)

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
        limit starts with a full bucket. A task this App knows nothing of is refused
        when it has tasks registered (a typo would otherwise limit nothing)."""
        scope, name = _rate_target(queue, task)
        if scope == "task" and self.tasks and name not in self.tasks:
            known = ", ".join(sorted(self.tasks))
            raise UnknownTaskError(f"unknown task {name!r} (registered: {known})")
        if not per_second > 0:
            raise InvalidJobError(f"per_second must be positive, got {per_second!r}")
        if burst is None:
            burst = max(1, -int(-per_second // 1))
        if burst < 1:
            raise InvalidJobError(f"burst must be at least 1, got {burst!r}")
        await (await self.store()).set_rate_limit(scope, name, per_second, burst)

    @audited("rate_limit.remove", lambda a: _rate_audit_target(a))
    async def remove_rate_limit(
        self, *, queue: str | None = None, task: str | Task | None = None
    ) -> bool:
        """Drop the rate limit of a queue or task; ``False`` if it had none."""
        scope, name = _rate_target(queue, task)
        return await (await self.store()).remove_rate_limit(scope, name)

    async def rate_limits(self) -> builtins.list[RateLimitInfo]:
        """Every rate limit, with the tokens its bucket holds now."""
        return await (await self.store()).list_rate_limits()

    async def limits(self) -> builtins.list[LimitInfo]:
        """Concurrency keys and resource pools, with what blocks them."""
        return await (await self.store()).list_limits()

    @audited("job.delete", _job_target)
    async def delete(self, job_id: int, *, actor: str | None = None) -> builtins.list[Job]:
        """Delete a job. Its active children are cancelled first ("parent job deleted");
        children that already ended are kept. Returns the children cancelled."""
        _, children = await (await self.store()).delete(job_id, actor)
        return children

    async def children(self, job_id: int) -> builtins.list[Job]:
        """The jobs ``job_id`` spawned, oldest first."""
        flt = JobFilter(parent_id=job_id, limit=100_000)
        return sorted(await (await self.store()).list_jobs(flt), key=lambda j: j.id)

    async def dependencies(self, job_id: int) -> tuple[builtins.list[int], builtins.list[int]]:
        """``(upstream, downstream)``: the ids a job depends on, and the ids that depend on it."""
        await self.get(job_id)
        return await (await self.store()).dependencies(job_id)

    async def downstream(self, job_id: int) -> builtins.list[Job]:
        """Every job that depends on ``job_id`` or descends from it, transitively."""
        return await (await self.store()).downstream([job_id])

    async def artifacts(self, job_id: int) -> builtins.list[ArtifactInfo]:
        """The artifacts a job saved."""
        await self.get(job_id)
        return await (await self.store()).list_artifacts(job_id)

    async def artifact(self, job_id: int, name: str) -> bytes:
        """One artifact's bytes; raises :class:`LookupError` if there is none."""
        data = await (await self.store()).get_artifact(job_id, name)
        if data is None:
            raise (
                JobNotFoundError(job_id)
                if await (await self.store()).get(job_id) is None
                else (LookupError(f"job {job_id} has no artifact named {name!r}"))
            )
        return data

    async def wait(self, job_id: int, timeout: float | None = None) -> Job:
        """Wait until the job is succeeded, failed or cancelled; return it.

        Raises :class:`WaitTimeoutError` if ``timeout`` seconds pass first.
        """
        return await self._wait_for(job_id, lambda j: j.is_terminal, timeout)

    async def _wait_for(
        self, job_id: int, done: Callable[[Job], bool], timeout: float | None
    ) -> Job:
        await self.listen()
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
    ) -> builtins.list[Job]:
        """Run every due job in this process until none is left; return the jobs that ran,
        as they ended. For tests and scripts; see :func:`tether.drain.run_until_idle`."""
        from tether.drain import run_until_idle

        return await run_until_idle(self, queues=tuple(queues) if queues else None, timeout=timeout)

    def run_until_idle_sync(
        self, *, queues: Sequence[str] | None = None, timeout: float | None = None
    ) -> builtins.list[Job]:
        """Blocking :meth:`run_until_idle`."""
        return self.run_sync(self.run_until_idle(queues=queues, timeout=timeout))

    # -- the API -------------------------------------------------------------------------

    async def feed(
        self, flt: FeedFilter, *, after_id: int | None = None, poll: float = 1.0
    ) -> AsyncGenerator[FeedEvent, None]:
        """The live feed: transitions matching ``flt`` as they happen, oldest first,
        forever (see :func:`tether.feed.follow`); ``after_id`` resumes after that event id."""
        return follow(await self.store(), flt, after_id=after_id, poll=poll)

    async def cancellations_of(
        self, owner: str, limit: int = 20, offset: int = 0
    ) -> builtins.list[CancellationRecord]:
        """Cancellation records of the jobs ``owner`` enqueued, newest first."""
        rows = await (await self.store()).list_owned_cancellations(
            owner, limit=limit, offset=offset
        )
        return [record_from_row(r) for r in rows]

    # -- maintenance: retention and the leader --------------------------------------------

    @audited("retention.prune", lambda a: "jobs (dry run)" if a["dry_run"] else "jobs")
    async def prune(
        self,
        *,
        older_than: float | None = None,
        states: Sequence[JobState | str] | None = None,
        dry_run: bool = False,
        progress: Callable[[str, PruneReport], None] | None = None,
    ) -> PruneReport:
        """Delete finished jobs (with their events, links, artifacts and cancellation
        records), old audit rows and gone worker rows after ``config.retention``, now.

        ``states`` limits it to jobs in those final states (and leaves audit and worker
        rows alone); ``older_than`` (seconds) replaces each state's retention;
        ``dry_run`` counts what would go and deletes nothing. Workers' maintenance
        leader does the same on its own every ``retention.interval`` seconds.
        """
        from tether.maintenance.pruner import Pruner

        if older_than is not None and older_than < 0:
            raise InvalidJobError("older_than must not be negative")
        names: builtins.list[str] | None = None
        if states is not None:
            try:
                parsed = [JobState(s) for s in states]
            except ValueError as exc:
                raise InvalidJobError(f"unknown state in {list(states)!r}") from exc
            if any(s not in TERMINAL for s in parsed):
                raise InvalidJobError(
                    "only finished jobs are pruned: use succeeded, failed or cancelled"
                )
            names = [s.value for s in parsed]
        pruner = Pruner(await self.store(), self.config.retention)
        return await pruner.prune(
            states=names, older_than=older_than, dry_run=dry_run, progress=progress
        )

    async def leader(self) -> LeaderInfo | None:
        """The worker that leads maintenance (pruning, schedules), if one holds the lease."""
        return await (await self.store()).get_leader(MAINTENANCE)

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
            self.schedule(
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

    def schedule(
        self,
        task: str | Task,
        *,
        cron: str,
        timezone: str = "UTC",
        args: dict[str, JSON] | None = None,
        name: str | None = None,
        missed: Missed = "none",
        jitter: float = 0.0,
        grace: float = DEFAULT_GRACE,
        queue: str | None = None,
    ) -> Schedule:
        """Enqueue a registered task once per tick of ``cron``; see :meth:`periodic`."""
        task_name = task.name if isinstance(task, Task) else task
        if task_name not in self.tasks:
            raise ConfigError(f"cannot schedule unknown task {task_name!r}; register it first")
        schedule = Schedule(
            name=name or task_name,
            task=task_name,
            cron=cron,
            timezone=timezone,
            args=dict(args or {}),
            missed=missed,
            jitter=jitter,
            grace=grace,
            queue=queue,
        )
        if schedule.name in self.schedules:
            raise ConfigError(f"a schedule named {schedule.name!r} already exists")
        # Refuse args that could never be enqueued now, not at the first tick.
        self.new_job(task_name, schedule.args, EnqueueOptions(queue=queue))
        self.schedules[schedule.name] = schedule
        return schedule

    def schedule_declarations(self) -> builtins.list[ScheduleDeclaration]:
        """This app's schedules as a worker records them for the maintenance leader:
        each with the job its task makes for a tick, built and checked here, where the
        task's code is (the leader may have none)."""
        out = []
        for name, schedule in self.schedules.items():
            opts = EnqueueOptions(queue=schedule.queue)
            job = self.new_job(schedule.task, dict(schedule.args), opts)
            stored = schedule.stored(job)
            out.append(
                ScheduleDeclaration(name, schedule.task, schedule.cron, schedule.timezone, stored)
            )
        return out

    async def list_schedules(self) -> builtins.list[ScheduleRow]:
        """Every schedule: those the database knows (declared by any worker) and this
        app's, with the last tick dealt with, the next one, the last job enqueued, and
        how many live workers declare it."""
        store = await self.store()
        rows = {r.name: r for r in await store.list_schedules()}
        declared = await store.declared_schedules()
        now = await store.db_time()
        for name, schedule in self.schedules.items():
            if name not in rows:
                rows[name] = ScheduleRow(
                    name,
                    schedule.task,
                    schedule.cron,
                    schedule.timezone,
                    False,
                    None,
                    None,
                    None,
                    None,
                )
        out = []
        for name in sorted(rows):
            row = rows[name]
            # The definition the leader fires, else (not recorded yet) this app's.
            fired: Schedule | None = self.schedules.get(name)
            if row.definition is not None:
                with contextlib.suppress(ConfigError):
                    fired = Schedule.load(name, row.definition)[0]
            next_tick = row.next_tick
            if fired is not None:
                next_tick = fired.next_tick(max(now, row.last_tick or now))
            out.append(
                dataclasses.replace(row, next_tick=next_tick, declared_by=declared.get(name, 0))
            )
        return out

    @audited("schedule.pause", lambda a: f"schedule:{a['name']}")
    async def pause_schedule(self, name: str) -> None:
        """Stop enqueueing a schedule's ticks (ticks that pass meanwhile are skipped)."""
        await self._set_schedule_paused(name, True)

    @audited("schedule.resume", lambda a: f"schedule:{a['name']}")
    async def resume_schedule(self, name: str) -> None:
        """Enqueue a paused schedule's ticks again, from its next tick on."""
        await self._set_schedule_paused(name, False)

    async def _set_schedule_paused(self, name: str, paused: bool) -> None:
        store = await self.store()
        if await store.set_schedule_paused(name, paused):
            return
        if name not in self.schedules:
            raise ScheduleNotFoundError(f"no schedule named {name!r}")
        # Known to this app but not yet recorded by a worker: record it, then set the flag.
        mine = [d for d in self.schedule_declarations() if d.name == name]
        await store.register_schedules(mine, await store.db_time(), None)
        await store.set_schedule_paused(name, paused)

    @audited("schedule.remove", lambda a: f"schedule:{a['name']}")
    async def remove_schedule(self, name: str) -> int:
        """Delete a schedule's row, so the leader fires it no more; returns how many
        live workers still declare it (each records it again when it next starts:
        remove it from their code first)."""
        store = await self.store()
        if not await store.delete_schedule(name):
            raise ScheduleNotFoundError(f"no schedule named {name!r}")
        return (await store.declared_schedules()).get(name, 0)


def _rate_audit_target(args: dict[str, Any]) -> str:
    task = args.get("task")
    if task is not None:
        return f"task:{_name(task)}"
    return f"queue:{args.get('queue')}"


def _rate_target(queue: str | None, task: str | Task | None) -> tuple[str, str]:
    """``("queue", name)`` or ``("task", name)``: exactly one of the two must be given."""
    if (queue is None) == (task is None):
        raise InvalidJobError("a rate limit applies to a queue or to a task: give one of them")
    if queue is not None:
        return "queue", names.check("queue", queue)
    assert task is not None
    return "task", names.check("task", task.name if isinstance(task, Task) else task)
