"""The App: task registry, enqueue, and every way to read or steer jobs."""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import os
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar, overload

from tether import hints as h
from tether import payload
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
    UnknownTaskError,
    WaitTimeoutError,
)
from tether.job import (
    JSON,
    ArtifactInfo,
    Job,
    JobEvent,
    JobFilter,
    LimitInfo,
    NewJob,
    QueueInfo,
    WorkerInfo,
)
from tether.portal import Portal
from tether.states import JobState
from tether.store import Store, create_store
from tether.task import EnqueueOptions, Executor, Task, is_async
from tether.workflow import Workflow

T = TypeVar("T")
DEFAULT_CANCEL_WAIT = 30.0


class App:
    """A tether application: the tasks it knows and the database it uses.

    ``url`` defaults to ``$TETHER_DATABASE_URL``, then ``sqlite:///tether.db``. The
    schema is migrated on first use unless ``config.auto_migrate`` is off.
    """

    def __init__(self, url: str | None = None, *, config: AppConfig | None = None) -> None:
        self.url = url or os.environ.get("TETHER_DATABASE_URL") or DEFAULT_DATABASE_URL
        self.config = config or AppConfig()
        create_store(self.url, self.config.store)  # validates the URL now, not at first use
        self.tasks: dict[str, Task] = {}
        self.resources: dict[str, int] = {}
        self._stores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Store] = (
            weakref.WeakKeyDictionary()
        )
        self._store_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._portal = Portal()

    def __repr__(self) -> str:
        return f"<tether.App {self.url} tasks={sorted(self.tasks)}>"

    # -- tasks ---------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

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
    ) -> Callable[[Callable[..., Any]], Task]: ...

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

        def register(fn: Callable[..., Any]) -> Task:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}"
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
        if not name:
            raise ConfigError("a resource needs a name")
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
                await store.open()
                if self.config.auto_migrate:
                    await store.migrate()
                for name, capacity in self.resources.items():
                    await store.define_limit(f"resource:{name}", "resource", capacity, False)
                self._stores[loop] = store
        return store

    async def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied."""
        store = create_store(self.url, self.config.store)
        try:
            await store.open()
            return await store.migrate()
        finally:
            await store.close()

    async def close(self) -> None:
        """Close this loop's store."""
        store = self._stores.pop(asyncio.get_running_loop(), None)
        if store is not None:
            await store.close()

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
        timeout = opts.timeout if opts.timeout is not None else task.timeout
        if timeout is not None and timeout <= 0:
            raise InvalidJobError("timeout must be positive")
        if opts.delay < 0:
            raise InvalidJobError("delay must not be negative")
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
            idempotency_key=opts.idempotency_key,
            budget=opts.budget,
            limits=tuple(limits),
            depends_on=tuple(opts.depends_on),
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
        and nothing new is created.
        """
        opts = opts or EnqueueOptions(**options)
        name = task.name if isinstance(task, Task) else task
        new = self.new_job(name, args, opts)
        (job,) = await (await self.store()).enqueue([new])
        return job

    async def enqueue_many(
        self, jobs: Iterable[tuple[str | Task, dict[str, JSON]]], **options: Any
    ) -> list[Job]:
        """Enqueue many jobs in one transaction: all of them, or none if one is invalid."""
        opts = EnqueueOptions(**options)
        new = [self.new_job(t.name if isinstance(t, Task) else t, args, opts) for t, args in jobs]
        return await (await self.store()).enqueue(new)

    async def enqueue_workflow(self, workflow: Workflow) -> dict[str, Job]:
        """Enqueue every job of ``workflow`` in one transaction; returns them by name.

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
        jobs = await (await self.store()).enqueue(new)
        return {node.name: job for node, job in zip(nodes, jobs, strict=True)}

    def enqueue_sync(
        self,
        task: str | Task,
        args: dict[str, JSON] | None = None,
        opts: EnqueueOptions | None = None,
        **options: Any,
    ) -> Job:
        """Blocking :meth:`enqueue` for sync code."""
        return self.run_sync(self.enqueue(task, args, opts, **options))

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

    # -- control -------------------------------------------------------------------------

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
        service = CancellationService(await self.store(), self.config.wait_poll_interval)
        return await service.cancel(
            job_id,
            reason=reason or "cancelled by request",
            force=force,
            cascade=cascade,
            wait=wait,
            actor=actor,
            request_id=request_id,
        )

    async def wait_cancelled(self, job_id: int, timeout: float) -> tuple[bool, builtins.list[str]]:
        """Wait until the job's cancellation has finished; return ``(success, errors)``.

        Event-driven (NOTIFY on PostgreSQL, in-process hints otherwise, polling as the
        fallback); a cancellation that already finished is answered at once.
        """
        await self.get(job_id)
        service = CancellationService(await self.store(), self.config.wait_poll_interval)
        record = await service.wait_settled(job_id, timeout)
        if record is None:
            return False, [f"job {job_id} has no cancellation"]
        if not record.settled:
            return False, [f"cancellation {record.id} is still {record.status} after {timeout}s"]
        errors = list((record.result or {}).get("errors", [])) or (
            [record.error] if record.error else []
        )
        return record.status == "completed", errors

    async def cancellation(self, job_id: int) -> CancellationRecord | None:
        """The job's cancellation record, if it was ever cancelled by request."""
        await self.get(job_id)
        row = await (await self.store()).get_cancellation(job_id=job_id, request_id=None)
        return record_from_row(row) if row is not None else None

    async def cancellations(
        self, limit: int = 20, offset: int = 0
    ) -> builtins.list[CancellationRecord]:
        """Cancellation records, newest first."""
        rows = await (await self.store()).list_cancellations(limit, offset)
        return [record_from_row(r) for r in rows]

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

    async def retry(self, job_id: int, *, actor: str | None = None) -> Job:
        """Queue a failed job again with a fresh set of attempts."""
        before = await self.get(job_id)
        if before.state is not JobState.FAILED:
            raise IllegalTransitionError(job_id, before.state.value, "retry")
        return await (await self.store()).retry(job_id, actor)

    async def pause_queue(self, name: str, *, reason: str | None = None) -> None:
        """Stop all claims from a queue; running jobs finish."""
        await (await self.store()).set_queue_paused(name, True, reason)

    async def resume_queue(self, name: str) -> None:
        """Let workers claim from a paused queue again."""
        await (await self.store()).set_queue_paused(name, False, None)

    async def queues(self) -> builtins.list[QueueInfo]:
        """Queues with their pause flags and job counts."""
        return await (await self.store()).list_queues()

    async def configure_key(
        self, key: str, *, max_running: int = 1, block_on_hold: bool = True
    ) -> None:
        """Set how many jobs of a concurrency key may run at once, and whether a paused
        or failed job under the key blocks it (the default)."""
        if max_running < 1:
            raise InvalidJobError("max_running must be at least 1")
        await (await self.store()).define_limit(f"key:{key}", "key", max_running, block_on_hold)

    async def limits(self) -> builtins.list[LimitInfo]:
        """Concurrency keys and resource pools, with what blocks them."""
        return await (await self.store()).list_limits()

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
        store = await self.store()
        listen: Callable[[], Awaitable[None]] | None = getattr(store, "listen", None)
        if listen is not None:
            await listen()
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

    def worker(self, config: WorkerConfig | None = None, **settings: Any) -> Any:
        """A :class:`~tether.worker.Worker` for this app (``settings`` as WorkerConfig)."""
        from tether.worker import Worker

        return Worker(self, config or WorkerConfig(**settings))

    # -- the API -------------------------------------------------------------------------

    async def cancellations_of(
        self, owner: str, limit: int = 20, offset: int = 0
    ) -> builtins.list[CancellationRecord]:
        """Cancellation records of the jobs ``owner`` enqueued, newest first."""
        rows = await (await self.store()).list_owned_cancellations(owner, limit, offset)
        return [record_from_row(r) for r in rows]
