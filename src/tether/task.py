"""A registered task: a named handler plus its defaults, and shortcuts to enqueue it."""

from __future__ import annotations

import asyncio
import inspect
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal

from typing_extensions import ParamSpec, TypeVar

from tether.arguments import Arguments
from tether.config import RetryPolicy
from tether.errors import ConfigError
from tether.job import Job

if TYPE_CHECKING:
    from tether.app import App

Executor = Literal["async", "thread", "process"]

# A task's handler parameters after the context, and what it returns; a bare ``Task``
# takes any arguments.
P = ParamSpec("P", default=...)
R = TypeVar("R", default=Any)


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-job options; ``None`` takes the task's default."""

    queue: str | None = None
    priority: int | None = None
    key: str | None = None
    delay: float = 0.0
    run_at: datetime | None = None
    """An absolute start time (timezone-aware), instead of ``delay``."""
    max_attempts: int | None = None
    timeout: float | None = None
    idempotency_key: str | None = None
    unique_for: float | None = None
    """Seconds the idempotency key stays taken by the job; later, the same key enqueues
    a new job. ``None``: for as long as the job exists."""
    owner: str | None = None
    budget: int | None = None
    depends_on: tuple[int, ...] = ()
    connection: object | None = None
    """The caller's database connection, in a transaction: the job commits or rolls
    back with it (a psycopg 3 connection, or a ``sqlite3.Connection`` to the same file)."""
    meta: Mapping[str, str] | None = None
    """String labels carried with the job (a trace context, an operator's tags): at most
    32 keys of 1 to 64 characters from ``A-Z a-z 0-9 _ . -``, values of at most 512
    characters, 4 KiB in all (:mod:`tether.job_meta`)."""


class Task(Generic[P, R]):
    """A handler registered with ``@app.task``. Call it directly to run it inline.

    Generic over the handler's parameters after the context, so a type checker checks
    ``crawl.enqueue(url=...)`` against ``async def crawl(ctx, url: str)``.
    """

    def __init__(
        self,
        app: App,
        fn: Callable[Concatenate[Any, P], R],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        timeout: float | None,
        retry: RetryPolicy,
        executor: Executor,
        priority: int = 0,
        resources: tuple[str, ...] = (),
    ) -> None:
        if max_attempts < 1:
            raise ConfigError(f"task {name}: max_attempts must be at least 1")
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"task {name}: timeout must be positive")
        if executor == "async" and not inspect.iscoroutinefunction(fn):
            raise ConfigError(f"task {name}: executor='async' needs an async def handler")
        if executor in ("thread", "process") and inspect.iscoroutinefunction(fn):
            raise ConfigError(f"task {name}: executor={executor!r} needs a plain def handler")
        if executor == "process" and "<locals>" in fn.__qualname__:
            raise ConfigError(
                f"task {name}: a process handler must be defined at module level, so the "
                "child process can import it"
            )
        unknown = sorted(set(resources) - set(app.resources))
        if unknown:
            raise ConfigError(
                f"task {name}: unknown resource(s) {', '.join(unknown)}; declare them first "
                "with app.resource(name, capacity=N)"
            )
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.retry = retry
        self.executor = executor
        self.priority = priority
        self.resources = resources
        self.arguments = Arguments(name, fn)
        self.__doc__ = fn.__doc__

    def __call__(self, ctx: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(ctx, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<tether.Task {self.name} executor={self.executor}>"

    async def call(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Run the handler here and now with a fresh test context and return its result
        (for tests; see :class:`tether.testing.TestContext` to observe the context)."""
        from tether.testing import TestContext

        return await TestContext().run(self, *args, **kwargs)

    def options(self, **options: Any) -> BoundTask[P, R]:
        """Enqueue with per-job options: ``crawl.options(key="x", priority=5).enqueue(...)``."""
        return BoundTask(self, EnqueueOptions(**options))

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Enqueue one job of this task; the arguments are the handler's (after the
        context), checked against its signature and annotations, and stored as JSON."""
        return await BoundTask(self, EnqueueOptions()).enqueue(*args, **kwargs)

    def enqueue_sync(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Blocking :meth:`enqueue`, for sync callers such as Django or Flask views."""
        return BoundTask(self, EnqueueOptions()).enqueue_sync(*args, **kwargs)


@dataclass(frozen=True)
class BoundTask(Generic[P, R]):
    """A task with enqueue options attached."""

    task: Task[P, R]
    opts: EnqueueOptions

    def options(self, **options: Any) -> BoundTask[P, R]:
        """Add or change options."""
        return BoundTask(self.task, replace(self.opts, **options))

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Enqueue one job."""
        named = self.task.arguments.bind(args, kwargs)
        return await self.task.app.enqueue(self.task.name, named, self.opts)

    def enqueue_sync(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Blocking :meth:`enqueue`."""
        named = self.task.arguments.bind(args, kwargs)
        return self.task.app.enqueue_sync(self.task.name, named, self.opts)


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` should run on the event loop rather than in a thread."""
    return inspect.iscoroutinefunction(fn) or asyncio.iscoroutinefunction(fn)


def module_name(fn: Callable[..., Any]) -> str:
    """The module a task's name starts with: ``fn.__module__``, except for a function
    defined in a script run as ``__main__``.

    ``python mymodule.py`` defines ``crawl`` in ``__main__``, while the worker
    (``tether worker --app mymodule:app``) imports the same file as ``mymodule``. The job
    must carry the name the worker knows, so a script's tasks are named after the
    module the script would be imported as: ``__spec__.name`` under ``python -m``, else
    the file's name. Without a file (an interactive session) the name stays
    ``__main__`` and a warning says that no worker will know it.
    """
    module = str(fn.__module__)
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    spec_name = getattr(spec, "name", None)
    if spec_name and spec_name != "__main__":
        return str(spec_name)  # python -m pkg.mod (or -m pkg: pkg.__main__)
    path = getattr(main, "__file__", None)
    if path:
        return Path(path).stem
    warnings.warn(
        f"task {fn.__qualname__} is defined in __main__ without a file; a worker cannot "
        "import it, so its jobs would wait forever. Define it in a module, or give it a "
        "name= that a worker registers.",
        stacklevel=4,
    )
    return module
