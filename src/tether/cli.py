"""The ``tether`` command: run workers, enqueue and inspect jobs, cancel them, run the demo.

Every command opens the database the same way: ``--database URL`` if given, else the URL
of the ``--app`` (when the command takes one and it is given), else
``$TETHER_DATABASE_URL``, else ``sqlite:///tether.db``. That mirrors :class:`tether.App`,
whose explicit URL also wins over the environment.

Exit codes: 0 success, 1 the operation failed (unknown job, illegal transition,
database unreachable), 2 the input was invalid (bad JSON, unknown task, malformed URL).
User mistakes print one red line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import ipaddress
import json
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tether import display, names
from tether.app import DEFAULT_CANCEL_WAIT, App
from tether.cancellation import CancellationRecord, CancellationResult
from tether.config import (
    DEFAULT_DATABASE_URL,
    DEFAULT_POOL_SIZE,
    SERVE_POOL_SIZE,
    RetentionConfig,
    WorkerConfig,
    parse_age,
)
from tether.errors import ConfigError, InvalidJobError, StoreError, TetherError
from tether.job import JSON, Job, JobEvent, TokenInfo, WorkerInfo
from tether.logs import JsonFormatter
from tether.ops import LeaderInfo, PruneReport
from tether.states import JobState
from tether.store import create_store, parse_sqlite_path
from tether.task import EnqueueOptions
from tether.worker import Worker

P = ParamSpec("P")
T = TypeVar("T")

EXIT_FAILED = 1
EXIT_USAGE = 2
# How often `job cancel` and `job wait` refresh the job's state while they wait.
LIVE_REFRESH = 0.5

# Consoles look up sys.stdout/sys.stderr at write time, so test runners that swap them
# still capture the output.
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

cli = typer.Typer(
    name="tether",
    help="tether: a durable job queue where every running job can be stopped safely.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    # Tracebacks are for bugs; locals would dump job payloads and URLs to the terminal.
    pretty_exceptions_show_locals=False,
)
job_cli = typer.Typer(help="Inspect and steer jobs.", no_args_is_help=True)
cli.add_typer(job_cli, name="job")

# -- options shared by commands ----------------------------------------------------------

DatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database",
        "-d",
        metavar="URL",
        help="Database URL: sqlite:///path.db or postgresql://host/db. Defaults to the "
        "--app's URL, then $TETHER_DATABASE_URL, then sqlite:///tether.db.",
        show_default=False,
    ),
]
AppOpt = Annotated[
    str | None,
    typer.Option(
        "--app",
        "-a",
        metavar="MODULE:ATTR",
        envvar="TETHER_APP",
        help="The tether.App to load, e.g. myproject.jobs:app (the current directory is "
        "importable).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
PoolSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--pool-size",
        min=1,
        metavar="N",
        help="Most PostgreSQL connections this process opens (plus one for notifications). "
        "Wins over the URL's pool_size parameter and the app's config; default "
        f"{DEFAULT_POOL_SIZE} ({SERVE_POOL_SIZE} for serve). SQLite ignores it.",
        show_default=False,
    ),
]

# The database URL the running command opened, to name it in connection errors.
_opened: list[str] = []


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print one red error line on stderr and exit with ``code``."""
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def friendly(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn tether's errors into one red line and an exit code instead of a traceback.

    Invalid input (:class:`InvalidJobError`, :class:`ConfigError`) exits 2, any other
    :class:`TetherError` (unknown job, illegal transition, database down) exits 1.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        _opened.clear()
        _pool_errors.install()
        try:
            return fn(*args, **kwargs)
        except (InvalidJobError, ConfigError) as exc:
            fail(str(exc), EXIT_USAGE)
        except StoreError as exc:
            # The store's message rarely says which database it could not reach, and
            # a PostgreSQL pool that gave up says why only in its log.
            where = f" (database {display.redact_url(_opened[-1])})" if _opened else ""
            why = f"; last error: {_pool_errors.last}" if _pool_errors.last else ""
            fail(f"{exc}{where}{why}", EXIT_FAILED)
        except TetherError as exc:
            fail(str(exc), EXIT_FAILED)
        finally:
            _pool_errors.uninstall()

    return wrapper


class _PoolErrors(logging.Handler):
    """Keeps the PostgreSQL pool's connection errors for the one-line error message.

    psycopg_pool logs a warning per failed connection attempt while it retries; on a
    one-shot command that is four copies of the cause followed by a vague timeout.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def install(self) -> None:
        """Capture from now on (idempotent); the worker lets them through to its log."""
        self.last = None
        pool_log = logging.getLogger("psycopg.pool")
        if self not in pool_log.handlers:
            pool_log.addHandler(self)
        pool_log.propagate = False

    def uninstall(self) -> None:
        """Stop capturing (matters only when commands run inside another program)."""
        pool_log = logging.getLogger("psycopg.pool")
        if self in pool_log.handlers:
            pool_log.removeHandler(self)
        pool_log.propagate = True

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().strip().splitlines()
        if message:
            self.last = message[0].split("connection failed: ", 1)[-1]


_pool_errors = _PoolErrors()


def load_app(ref: str) -> App:
    """Import ``module:attr`` (``attr`` defaults to ``app``) and return the App it names.

    The current directory goes first on ``sys.path``, as uvicorn does, so ``--app
    jobs:app`` finds ``./jobs.py``. A module that is missing is a one-line error; an
    exception raised while importing the user's module keeps its traceback, since that
    is a bug in their code that they need to see.
    """
    module_name, _, attr = ref.partition(":")
    attr = attr or "app"
    if not module_name:
        raise ConfigError(f"--app {ref!r} names no module: use MODULE:ATTR, e.g. jobs:app")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing module is the user's typo; a missing import inside it is a bug.
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f"cannot import module {module_name!r} (from --app {ref}); "
                f"is it in the current directory or installed?"
            ) from exc
        raise
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, App):
        raise ConfigError(f"--app {ref} is a {type(obj).__name__}, not a tether.App")
    return obj


def open_app(database: str | None, app_ref: str | None = None, *, create: bool = False) -> App:
    """The App a command works with; see the module docstring for the URL's precedence.

    A SQLite file that does not exist is an error unless ``create`` (``migrate``,
    ``worker``): a typo in ``--database`` would otherwise create an empty database and
    report zeros. A URL that an ``--app`` defines is the app's own, and may be created.
    """
    if not create and (database or not app_ref):
        _require_database(database or os.environ.get("TETHER_DATABASE_URL") or DEFAULT_DATABASE_URL)
    if app_ref:
        app = load_app(app_ref)
        if database:
            # The App builds its store lazily from ``url`` on first use, so replacing it
            # before any call is enough; create_store validates it as the App would.
            create_store(database)
            app.url = database
    else:
        app = App(database)
    # Every change a command makes is audited in the name of the local user.
    app.actor = _cli_actor()
    _opened.append(app.url)
    return app


def _require_database(url: str) -> None:
    """Refuse a SQLite URL whose file does not exist."""
    create_store(url)  # a malformed URL gets its own clear error first
    if url.startswith("sqlite:"):
        path = parse_sqlite_path(url)
        if not os.path.exists(path):
            _opened.append(url)
            raise StoreError(
                f"no SQLite database at {path}: check --database (`tether migrate` or a "
                "worker creates one)"
            )


@contextlib.asynccontextmanager
async def _watching(app: App, job_id: int, doing: str, enabled: bool = True) -> AsyncIterator[None]:
    """While the body runs, show a spinner on stderr with the job's state and the time
    waited so far (only on a terminal: piped output stays clean)."""
    if not enabled or not err.is_terminal:
        yield
        return
    started = time.monotonic()
    with err.status(f"{doing} job {job_id}") as status:

        async def refresh() -> None:
            while True:
                try:
                    state = (await app.get(job_id)).display_state
                except TetherError:
                    state = "?"
                waited = time.monotonic() - started
                status.update(f"{doing} job {job_id}: {state} ({waited:.0f}s)")
                await asyncio.sleep(LIVE_REFRESH)

        task = asyncio.create_task(refresh())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def set_pool_size(app: App, size: int | None, default: int | None = None) -> None:
    """Apply ``--pool-size``: it wins over the URL's ``pool_size`` and the app's config.
    Without it, ``default`` applies where neither the URL nor the config sets a size."""
    if size is None:
        if default is not None and app.config.store.pool_size is None:
            store = dataclasses.replace(app.config.store, pool_size=default)
            app.config = dataclasses.replace(app.config, store=store)
        return
    store = dataclasses.replace(app.config.store, pool_size=size)
    app.config = dataclasses.replace(app.config, store=store)
    parts = urlsplit(app.url)
    if parts.scheme.lower().startswith("postgres"):
        query = parse_qsl(parts.query, keep_blank_values=True)
        kept = [(k, v) for k, v in query if k != "pool_size"]
        if len(kept) != len(query):
            app.url = urlunsplit(parts._replace(query=urlencode(kept)))


def run(app: App, coro: Coroutine[Any, Any, T]) -> T:
    """Run one command's coroutine on a fresh loop, then close that loop's store."""

    async def main() -> T:
        try:
            return await coro
        finally:
            await app.close()

    return asyncio.run(main())


def print_json(value: Any) -> None:
    """Write JSON to stdout exactly (no Rich wrapping or highlighting)."""
    typer.echo(json.dumps(display.to_json(value), indent=2, sort_keys=False))


def now_utc() -> datetime:
    """The local clock as an aware UTC time, for display ages only."""
    return datetime.now(UTC)


# -- worker ------------------------------------------------------------------------------


@cli.command()
@friendly
def worker(
    app_ref: Annotated[
        str,
        typer.Option(
            "--app",
            "-a",
            metavar="MODULE:ATTR",
            envvar="TETHER_APP",
            help="The tether.App whose tasks to run, e.g. myproject.jobs:app.",
            show_default=False,
        ),
    ],
    database: DatabaseOpt = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Jobs run at the same time.")
    ] = WorkerConfig.concurrency,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            help="A queue to take jobs from (repeatable). Default: every queue the app's "
            "tasks use.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="A name shown by `tether workers`.", show_default=False)
    ] = None,
    stop_timeout: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds running jobs get to finish after SIGTERM before they are released.",
        ),
    ] = WorkerConfig.stop_timeout,
    lease: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds a job's lease lasts without a heartbeat; a worker that vanishes has "
            "its jobs run again about this long after. At least 2 x --heartbeat + 2.",
        ),
    ] = WorkerConfig.lease_duration,
    heartbeat: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds between heartbeats, which extend the leases."),
    ] = WorkerConfig.heartbeat_interval,
    cancel_grace: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds an async handler has, after ctx.cancelled is set, before it gets "
            "CancelledError.",
        ),
    ] = WorkerConfig.cancel_grace,
    ramp_window: Annotated[
        float,
        typer.Option(
            min=0,
            help="Open the worker's slots gradually over this many seconds after it starts "
            "(0: all at once).",
        ),
    ] = WorkerConfig.ramp_window,
    max_abandoned_threads: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Stop gracefully (exit code 75, for the supervisor to restart the worker) "
            "once more than this many thread handlers that ignored being stopped still run. "
            "Default: no limit; a full thread pool only stops thread jobs being claimed.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: Annotated[
        str,
        typer.Option(
            help="text (for people) or json (one JSON object per line, for log collectors)."
        ),
    ] = "text",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=1, max=65535, help="Serve Prometheus metrics on this port.", show_default=False
        ),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="Address for --metrics-port.")] = "127.0.0.1",
    retain: Annotated[
        list[str] | None,
        typer.Option(
            "--retain",
            metavar="KIND=AGE",
            help="Keep finished rows this long before the maintenance leader prunes them "
            "(repeatable): KIND is succeeded, failed, cancelled, audit or workers; AGE is "
            "like 12h or 7d, or 'forever'. Defaults: the app's retention (succeeded=1d, "
            "failed=7d, cancelled=7d, audit=90d, workers=7d).",
            show_default=False,
        ),
    ] = None,
    pool_size: PoolSizeOpt = None,
) -> None:
    """Run jobs until SIGTERM or Ctrl-C.

    The first signal stops claiming and gives running jobs --stop-timeout seconds; what
    still runs then goes back to the queue with its checkpoint, without spending an
    attempt. A second signal releases them at once.
    """
    level = logging.getLevelNamesMapping().get(log_level.upper())
    if level is None:
        fail(f"unknown --log-level {log_level!r}: use debug, info, warning or error", EXIT_USAGE)
    if log_format not in ("text", "json"):
        fail(f"unknown --log-format {log_format!r}: use text or json", EXIT_USAGE)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    logging.basicConfig(level=level, handlers=[handler])
    # A long-running worker logs every connection failure, with its timestamp.
    logging.getLogger("psycopg.pool").propagate = True
    app = open_app(database, app_ref, create=True)
    if retain:
        app.config = dataclasses.replace(
            app.config, retention=retention_from(app.config.retention, retain)
        )
    set_pool_size(app, pool_size)
    queues = tuple(dict.fromkeys(queue)) if queue else _app_queues(app)
    config = WorkerConfig(
        concurrency=concurrency,
        queues=queues,
        name=name,
        stop_timeout=stop_timeout,
        max_abandoned_threads=max_abandoned_threads,
        lease_duration=lease,
        heartbeat_interval=heartbeat,
        cancel_grace=cancel_grace,
        ramp_window=ramp_window,
    )
    w = Worker(app, config)
    if metrics_port is not None:
        _serve_metrics(metrics_host, metrics_port)
    logging.getLogger("tether.cli").info("database %s", display.redact_url(app.url))
    run(app, w.run(handle_signals=True))
    # Thread handlers cannot be interrupted: one that ignored its cancel request is
    # abandoned (its lease settled, its writes fenced off) but its thread runs on.
    # Those threads are not daemons, so a normal exit would join them and the process
    # could hang forever after the worker has already stopped. Everything the worker
    # owed the database is written by now, so flush our output and leave at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(w.exit_code)


def _app_queues(app: App) -> tuple[str, ...]:
    queues = [app.config.default_queue, *(t.queue for t in app.tasks.values())]
    return tuple(dict.fromkeys(queues))


# -- migrate -----------------------------------------------------------------------------


@cli.command()
@friendly
def migrate(database: DatabaseOpt = None, app_ref: AppOpt = None) -> None:
    """Create or upgrade tether's tables (workers and producers also do it on first use)."""
    app = open_app(database, app_ref, create=True)
    applied = run(app, app.migrate())
    if applied:
        out.print(f"applied migrations: {', '.join(str(v) for v in applied)}")
    else:
        out.print("database is up to date")


# -- enqueue -----------------------------------------------------------------------------


@cli.command()
@friendly
def enqueue(
    task: Annotated[str, typer.Argument(help="Task name (a unique suffix like 'crawl' works).")],
    args: Annotated[
        str,
        typer.Option(
            "--args",
            help="The job's arguments as a JSON object; @FILE reads it from a file, - from stdin.",
        ),
    ] = "{}",
    app_ref: AppOpt = None,
    database: DatabaseOpt = None,
    queue: Annotated[
        str | None, typer.Option(help="Queue (default: the task's).", show_default=False)
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(help="Higher runs first (default: the task's).", show_default=False),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(help="Concurrency key: one running job per key.", show_default=False),
    ] = None,
    delay: Annotated[float, typer.Option(min=0, help="Seconds before it may run.")] = 0.0,
    max_attempts: Annotated[
        int | None, typer.Option(min=1, help="Attempts before it fails.", show_default=False)
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(help="Seconds one attempt may run (default: the task's).", show_default=False),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            help="Enqueue at most once per key; repeats return the same job.", show_default=False
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Enqueue one job and print its id and state."""
    text = _read_args(args)
    try:
        parsed: JSON = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"--args is not valid JSON: {exc}", EXIT_USAGE)
    if not isinstance(parsed, dict):
        shown = text if len(text) <= 40 else text[:39] + "…"
        fail(f"--args must be a JSON object like '{{\"x\": 1}}', got {shown!r}", EXIT_USAGE)
    if not app_ref:
        fail("enqueue needs the app's tasks: pass --app MODULE:ATTR or set TETHER_APP", EXIT_USAGE)
    app = open_app(database, app_ref)
    name = _resolve_task(app, task)
    opts = EnqueueOptions(
        queue=queue,
        priority=priority,
        key=key,
        delay=delay,
        max_attempts=max_attempts,
        timeout=timeout,
        idempotency_key=idempotency_key,
    )
    job = run(app, app.enqueue(name, parsed, opts))
    if as_json:
        print_json(job)
        return
    line = Text(f"job {job.id} ")
    line.append(job.task, style="bold")
    line.append(" is ")
    line.append_text(display.state_text(job.display_state))
    if job.state.value == "queued" and job.run_at > now_utc():
        line.append(f" (runs in {display.age(now_utc(), job.run_at)})")
    out.print(line)


def _read_args(value: str) -> str:
    """``--args`` itself, or the file it names with ``@path``, or stdin for ``-``.

    Command lines are limited to about 128 KB per argument, well below the payload limit.
    """
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        try:
            with open(value[1:], encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            fail(f"cannot read --args file {value[1:]!r}: {exc.strerror}", EXIT_USAGE)
    return value


def _resolve_task(app: App, name: str) -> str:
    """The registered name for ``name``: exact, else the one task ending in ``.name``.

    Tasks are registered as ``module.function`` by default, which is long to type.
    """
    if name in app.tasks:
        return name
    matches = [t for t in app.tasks if t.endswith("." + name)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise InvalidJobError(f"task {name!r} is ambiguous: {', '.join(sorted(matches))}")
    return name  # App.enqueue reports it as unknown, listing the registered tasks


# -- job ---------------------------------------------------------------------------------


@job_cli.command("list")
@friendly
def job_list(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state", "-s", help="Only jobs in this state (repeatable).", show_default=False
        ),
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Only this queue.", show_default=False)] = None,
    task: Annotated[str | None, typer.Option(help="Only this task.", show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many.")] = 50,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    app = open_app(database, app_ref)
    jobs = run(app, app.list(state=state or None, queue=queue, task=task, limit=limit))
    if as_json:
        print_json(jobs)
        return
    if not jobs:
        out.print("no jobs")
        return
    now = now_utc()
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("id", "task", "state", "attempt", "queue", "worker", "progress", "age"):
        table.add_column(
            col,
            justify="right" if col in ("id", "attempt", "age") else "left",
            no_wrap=col in ("id", "state", "attempt", "progress", "age"),
            overflow="ellipsis",
        )
    for j in jobs:
        table.add_row(
            str(j.id),
            j.task,
            display.state_text(j.display_state),
            f"{j.attempt}/{j.max_attempts}",
            j.queue,
            j.worker_id or "",
            display.job_bar(j, width=10),
            display.age(j.created_at, now),
        )
    out.print(table)


@job_cli.command("show")
@friendly
def job_show(
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show every field of one job, its history, and its cancellation if any."""
    app = open_app(database, app_ref)

    async def fetch() -> tuple[Job, list[JobEvent], CancellationRecord | None, str | None]:
        job = await app.get(job_id)
        return (
            job,
            await app.events(job_id),
            await app.cancellation(job_id),
            await app.unserved_reason(job),
        )

    job, events, cancellation, unserved = run(app, fetch())
    if as_json:
        print_json(
            {"job": job, "events": events, "cancellation": cancellation, "unserved": unserved}
        )
        return
    now = now_utc()
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column(overflow="fold")
    for name, value in display.to_json(job).items():
        if name == "display_state":
            continue
        if name == "state":
            # As people see it: a running job with a cancel request is "cancelling".
            fields.add_row(name, display.state_text(job.display_state))
            continue
        if value is None:
            text: Text | str = Text("-", style="grey50")
        elif isinstance(value, dict | list):
            text = json.dumps(value)
        else:
            text = str(value)
        if name.endswith("_at") and value is not None:
            stamp = getattr(job, name)
            rel = (
                display.age(stamp, now) + " ago"
                if stamp <= now
                else "in " + display.age(now, stamp)
            )
            text = f"{value}  ({rel})"
        fields.add_row(name, text)
    out.print(fields)
    if unserved is not None:
        out.print(Text(f"⚠ waiting forever: {unserved}", style="yellow"))
    out.print()
    history = Table(title="history", title_justify="left", box=None, header_style="bold")
    history.add_column("at", no_wrap=True)
    history.add_column("transition", no_wrap=True)
    for col in ("worker", "actor", "reason"):
        history.add_column(col, overflow="fold")
    for ev in events:
        change = Text(f"{ev.from_state.value if ev.from_state else '∅'} → ")
        change.append_text(display.state_text(ev.to_state.value))
        history.add_row(
            ev.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
            change,
            ev.worker_id or "",
            ev.actor or "",
            display.first_line(ev.reason, 120),
        )
    out.print(history)
    if cancellation is not None:
        out.print()
        line = Text("cancellation ", style="bold")
        line.append(f"{cancellation.id}: ")
        line.append(cancellation.status, style=_RECORD_STYLES.get(cancellation.status, ""))
        line.append(f"  (details: tether job cancel-status {job.id})", style="grey50")
        out.print(line)


@job_cli.command("cancel")
@friendly
def job_cancel(
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    reason: Annotated[
        str | None, typer.Option(help="Recorded with the cancellation.", show_default=False)
    ] = None,
    force: Annotated[
        bool,
        typer.Option(help="Stop a running job at once, without its grace period."),
    ] = False,
    cascade: Annotated[
        bool, typer.Option(help="Also cancel the jobs it spawned that have not finished.")
    ] = True,
    wait: Annotated[
        float,
        typer.Option(min=0, help="Seconds to wait for a running job to stop (0: do not wait)."),
    ] = DEFAULT_CANCEL_WAIT,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a job: at once if it is not running, else ask its worker to stop it.

    Exits 0 once the job is cancelled (or already was, or finished first, or is still
    stopping), 1 if it succeeded already or does not exist.
    """
    app = open_app(database, app_ref)

    async def go() -> tuple[Job, CancellationResult]:
        before = await app.get(job_id)
        async with _watching(app, job_id, "Cancelling", enabled=not as_json):
            return before, await app.cancel(
                job_id, reason=reason, force=force, cascade=cascade, wait=wait, actor=app.actor
            )

    before, res = run(app, go())
    if before.state is JobState.CANCELLED and res.outcome == "cancelled":
        # A repeated request shares the first one's record, which says "cancelled";
        # the person asking now wants to know that it was so before they asked.
        res = dataclasses.replace(res, outcome="already_cancelled")
    if as_json:
        print_json(res)
        return
    out.print(Text(f"Cancelling job {before.id} ({before.task})", style="bold"))
    out.print(f"Reason: {reason or 'cancelled by request'}")
    if res.steps:
        out.print()
        out.print("Progress:")
        for line in _progress_lines(res):
            out.print(line)
        out.print()
        out.print("Summary:")
        out.print(f"- Tasks completed: {len(res.tasks_completed)}")
        out.print(f"- Tasks cancelled: {len(res.tasks_cancelled)}")
        if res.tasks_failed:
            out.print(f"- Tasks failed: {len(res.tasks_failed)}")
        if res.dependents_blocked:
            blocked = ", ".join(map(str, res.dependents_blocked))
            out.print(f"- Dependents left blocked: {blocked}")
        out.print(f"- Runners terminated: {len(res.runners_terminated)}")
        out.print(f"- Duration: {res.duration_seconds:.2f}s")
        out.print()
    out.print(_cancel_message(res))
    for problem in res.errors if res.outcome != "requested" else res.errors[1:]:
        out.print(Text(f"  note: {problem}", style="yellow"))
    if res.cancellation_id:
        out.print(f"Cancellation ID: {res.cancellation_id}")
        out.print(f"Status: {res.status.upper()}")


def _progress_lines(res: CancellationResult) -> list[Text]:
    """The record's steps as people read them: ✓ done, ✗ failed, - nothing to do."""
    marks = {"completed": ("✓", "green"), "failed": ("✗", "red"), "skipped": ("-", "dim")}
    lines = []
    for step in res.steps:
        mark, style = marks.get(step.status, ("?", "yellow"))
        d = step.details
        if step.name == "request":
            text = f"Stopped task assignment ({d.get('state_before')} → {d.get('state_after')})"
        elif step.name == "stop_runners":
            runners = d.get("runners_terminated", [])
            if step.status == "skipped":
                text = "No runner was active"
            elif runners or step.status == "failed":
                text = f"Terminated {len(runners)} runner(s)" + (
                    f": {', '.join(runners)}" if runners else ""
                )
            else:
                text = "No runner to stop: the job ended before the request reached it"
        elif step.name == "update_tasks":
            text = (
                f"Cancelled {len(d.get('cancelled', []))} task(s); "
                f"kept {len(d.get('completed', []))} completed"
            )
        elif step.name == "clean_resources":
            lines.append(
                Text(f"{mark} Released {len(d.get('slots_released', []))} slot(s)", style=style)
            )
            text = f"Preserved {len(d.get('artifacts_preserved', []))} artifact(s)"
        elif step.name == "dismiss":
            text = "Dismissed the failed job (failed → cancelled)"
        elif step.name == "follow_up":
            ended = ", ".join(f"job {i} {state}" for i, state in d.get("ended", {}).items())
            text = f"Followed up once the job(s) stopped: {ended}"
        elif step.name == "settle_from_job_states":
            ended = ", ".join(f"job {i} {state}" for i, state in d.get("ended", {}).items())
            text = f"Settled from the job states ({d.get('why')}): {ended or 'none ended'}"
        else:
            text = step.name
        if step.error:
            text += f" — {step.error}"
        lines.append(Text(f"{mark} {text}", style=style))
    return lines


def _cancel_message(res: CancellationResult) -> Text:
    j = res.job
    if res.outcome == "cancelled":
        return Text(f"job {j.id} cancelled", style="green")
    if res.outcome == "already_cancelled":
        return Text(f"job {j.id} was already cancelled", style="yellow")
    if res.outcome == "finished_first":
        return Text(
            f"job {j.id} {j.state.value} before it saw the cancel request; its result stands",
            style="yellow",
        )
    if res.outcome == "failed_over_budget":
        return Text(
            f"job {j.id} was paused over its budget, so it failed instead of being cancelled",
            style="yellow",
        )
    # Still running: the service's first error says why and what happens next.
    detail = res.errors[0] if res.errors else "its worker will stop it; it will not run again"
    return Text(f"job {j.id} is {j.display_state}: {detail}", style="yellow")


@job_cli.command("cancel-status")
@friendly
def job_cancel_status(
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a job's cancellation record: its steps, what it stopped, and any errors."""
    app = open_app(database, app_ref)
    record = run(app, app.cancellation(job_id))
    if record is None:
        fail(f"job {job_id} has no cancellation record")
    if as_json:
        print_json(record)
        return
    now = now_utc()
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    head.add_row("cancellation", record.id)
    head.add_row("job", str(record.job_id))
    head.add_row("status", Text(record.status, style=_RECORD_STYLES.get(record.status, "")))
    head.add_row("reason", record.reason or "-")
    head.add_row("force / cascade", f"{record.force} / {record.cascade}")
    head.add_row("initiated", f"{display.age(record.initiated_at, now)} ago by "
                 f"{record.initiated_by or 'unknown'}")  # fmt: skip
    if record.completed_at is not None:
        took = (record.completed_at - record.initiated_at).total_seconds()
        head.add_row("completed", f"{display.age(record.completed_at, now)} ago, took {took:.2f}s")
    for name, value in (record.result or {}).items():
        if value and name not in ("errors", "duration_seconds"):
            head.add_row(name.replace("_", " "), json.dumps(value))
    if record.error:
        head.add_row("error", Text(record.error, style="red"))
    out.print(head)
    steps = Table(title="steps", title_justify="left", box=None, header_style="bold")
    for col in ("step", "status", "details", "error"):
        steps.add_column(col, overflow="fold", no_wrap=col in ("step", "status"))
    for step in record.steps:
        steps.add_row(
            step.name,
            Text(step.status, style=_RECORD_STYLES.get(step.status, "")),
            json.dumps(step.details) if step.details else "",
            Text(step.error or "", style="red"),
        )
    out.print()
    out.print(steps)


_RECORD_STYLES = {"completed": "green", "partial": "yellow", "failed": "red", "skipped": "grey50"}


@job_cli.command("cancellations")
@friendly
def job_cancellations(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many.")] = 20,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many (newest first).")] = 0,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List cancellations, newest first."""
    app = open_app(database, app_ref)
    records = run(app, app.cancellations(limit, offset))
    if as_json:
        print_json(records)
        return
    if not records:
        out.print("no cancellations")
        return
    now = now_utc()
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("id", "job", "status", "by", "age", "reason"):
        table.add_column(col, no_wrap=col != "reason", overflow="ellipsis")
    for r in records:
        table.add_row(
            r.id,
            str(r.job_id),
            Text(r.status, style=_RECORD_STYLES.get(r.status, "")),
            r.initiated_by or "",
            display.age(r.initiated_at, now),
            r.reason or "",
        )
    out.print(table)


@job_cli.command("pause")
@friendly
def job_pause(
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    reason: Annotated[
        str | None, typer.Option(help="Recorded with the pause.", show_default=False)
    ] = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause a job: at once if it waits to run, at its next checkpoint if it runs."""
    app = open_app(database, app_ref)
    job = run(app, app.pause(job_id, reason=reason, actor=app.actor))
    if as_json:
        print_json(job)
    elif job.state is JobState.PAUSED:
        out.print(Text(f"job {job.id} paused (tether job resume {job.id} continues it)"))
    else:
        out.print(Text(f"job {job.id} is {job.display_state}: it pauses at its next checkpoint"))


@job_cli.command("resume")
@friendly
def job_resume(
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    budget: Annotated[
        int | None,
        typer.Option(min=1, help="A new usage budget for the job.", show_default=False),
    ] = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Queue a paused job again; it continues from its checkpoint."""
    app = open_app(database, app_ref)
    job = run(app, app.resume(job_id, budget=budget, actor=app.actor))
    if as_json:
        print_json(job)
    elif job.state is JobState.RUNNING:
        out.print(f"job {job.id}: pause withdrawn; it keeps running")
    else:
        out.print(Text(f"job {job.id} is {job.display_state} again"))


@job_cli.command("retry")
@friendly
def job_retry(
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Queue a failed job again with a fresh set of attempts."""
    app = open_app(database, app_ref)
    job = run(app, app.retry(job_id, actor=app.actor))
    if as_json:
        print_json(job)
    else:
        out.print(f"job {job.id} is {job.display_state} again with {job.max_attempts} attempts")


@job_cli.command("delete")
@friendly
def job_delete(
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a job. Its active children are cancelled first ("parent job deleted");
    children that already finished are kept."""
    app = open_app(database, app_ref)
    children = run(app, app.delete(job_id, actor=app.actor))
    if as_json:
        print_json({"deleted": job_id, "children_cancelled": [c.id for c in children]})
        return
    out.print(f"job {job_id} deleted")
    if children:
        out.print(
            f"cancelled {len(children)} active child job(s): "
            + ", ".join(str(c.id) for c in children)
        )


@job_cli.command("wait")
@friendly
def job_wait(
    job_id: Annotated[int, typer.Argument(help="The job id.", show_default=False)],
    timeout: Annotated[
        float | None,
        typer.Option(min=0, help="Give up after this many seconds.", show_default=False),
    ] = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Wait until a job succeeds, fails or is cancelled; exit 0 only if it succeeded."""
    app = open_app(database, app_ref)

    async def go() -> Job:
        async with _watching(app, job_id, "Waiting for"):
            return await app.wait(job_id, timeout)

    job = run(app, go())
    line = Text(f"job {job.id} ")
    line.append_text(display.state_text(job.display_state))
    if job.error:
        line.append(f": {display.first_line(job.error, 200)}")
    out.print(line)
    if job.state.value != "succeeded":
        raise typer.Exit(EXIT_FAILED)


# -- queues ------------------------------------------------------------------------------

queue_cli = typer.Typer(help="List, pause and resume queues.", no_args_is_help=True)
cli.add_typer(queue_cli, name="queue")


@queue_cli.command("list")
@friendly
def queue_list(
    database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False
) -> None:
    """List queues with their jobs by state and whether they are paused."""
    app = open_app(database, app_ref)
    queues = run(app, app.queues())
    if as_json:
        print_json(queues)
        return
    if not queues:
        out.print("no queues")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("queue")
    table.add_column("paused")
    for state in ("queued", "running", "retrying", "paused", "failed"):
        table.add_column(state, justify="right")
    for q in queues:
        table.add_row(
            q.name,
            Text(f"yes ({q.reason})" if q.paused and q.reason else "yes", style="yellow")
            if q.paused
            else "",
            *(
                str(q.counts.get(s, 0))
                for s in ("queued", "running", "retrying", "paused", "failed")
            ),
        )
    out.print(table)
    for q in queues:
        for u in q.unserved:
            note = f"⚠ queue {q.name}: {u.jobs} waiting job(s): {u.reason}"
            out.print(Text(note, style="yellow"))


@queue_cli.command("pause")
@friendly
def queue_pause(
    name: Annotated[str, typer.Argument(help="The queue.", show_default=False)],
    reason: Annotated[
        str | None, typer.Option(help="Why (shown by `tether queue list`).", show_default=False)
    ] = None,
    create: Annotated[
        bool,
        typer.Option(help="Pause a queue that has never been seen (no jobs, no worker) too."),
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Stop workers from claiming from a queue; running jobs finish."""
    app = open_app(database, app_ref)

    async def go() -> None:
        # An unsafe name is refused (and audited) by the App itself, before any lookup.
        if not create and names.is_safe(name):
            await _known_queue(app, name)
        await app.pause_queue(name, reason=reason)

    run(app, go())
    out.print(f"queue {name} paused: no new claims; running jobs finish")


@queue_cli.command("resume")
@friendly
def queue_resume(
    name: Annotated[str, typer.Argument(help="The queue.", show_default=False)],
    create: Annotated[
        bool, typer.Option(help="Accept a queue that has never been seen (no jobs, no worker).")
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Let workers claim from a paused queue again."""
    app = open_app(database, app_ref)

    async def go() -> None:
        # An unsafe name is refused (and audited) by the App itself, before any lookup.
        if not create and names.is_safe(name):
            await _known_queue(app, name)
        await app.resume_queue(name)

    run(app, go())


async def _known_queue(app: App, name: str) -> None:
    """Refuse a queue that has no jobs, no pause flag and no worker: most likely a typo."""
    known = {q.name for q in await app.queues()}
    known |= {q for w in await app.workers() for q in w.queues}
    if name not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise InvalidJobError(
            f"queue {name!r} has never been seen (known queues: {listed}); "
            "use --create to pause or resume it anyway"
        )
    out.print(f"queue {name} resumed")


# -- stats and workers -------------------------------------------------------------------


@cli.command()
@friendly
def stats(database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False) -> None:
    """Count jobs in each state."""
    app = open_app(database, app_ref)
    counts = run(app, app.stats())
    if as_json:
        print_json(counts)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("state")
    table.add_column("jobs", justify="right")
    for state, n in counts.items():
        table.add_row(display.state_text(state), str(n), style="" if n else "grey50")
    table.add_row(Text("total", style="bold"), Text(str(sum(counts.values())), style="bold"))
    out.print(table)


@cli.command()
@friendly
def workers(
    show_all: Annotated[
        bool, typer.Option("--all", help="Include stopped and dead workers.")
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List workers: active and draining ones unless --all."""
    app = open_app(database, app_ref)
    found, leader = run(app, _workers_and_leader(app))
    shown = found if show_all else [w for w in found if w.state in ("active", "draining")]
    leads = leader.holder if leader is not None and leader.active else None
    if as_json:
        print_json([{**display.to_json(w), "leader": w.id == leads} for w in shown])
        return
    if shown:
        now = now_utc()
        table = Table(box=None, header_style="bold", pad_edge=False)
        # Only when some worker has them: hung handler threads it could not stop.
        abandoned = any(w.abandoned_threads for w in shown)
        cols = ["id", "name", "host", "pid", "state", "running", "heartbeat", "started"]
        for col in cols + (["abandoned"] if abandoned else []):
            # The facts of a worker stay on one line; its queues and tasks wrap instead.
            table.add_column(
                col, justify="right" if col in ("pid", "running") else "left", no_wrap=True
            )
        table.add_column("queues", overflow="fold")
        table.add_column("tasks", overflow="fold")
        for w in shown:
            row: list[str | Text] = [
                w.id,
                w.name or "",
                w.host,
                str(w.pid),
                display.worker_state_text(w.state)
                + (Text(" ★ leader", style="bold") if w.id == leads else ""),
                str(w.running_jobs),
                display.age(w.heartbeat_at, now) + " ago",
                display.age(w.started_at, now) + " ago",
            ]
            if abandoned:
                # A full pool claims no thread jobs until the worker restarts.
                row.append(
                    Text(f"{w.abandoned_threads} threads, pool full", style="red")
                    if w.thread_pool_full
                    else Text(str(w.abandoned_threads or ""), style="yellow")
                )
            row.append(",".join(w.queues))
            row.append(", ".join(w.tasks) if w.tasks is not None else Text("?", style="grey50"))
            table.add_row(*row)
        out.print(table)
    else:
        out.print("no active workers")
    hidden = len(found) - len(shown)
    if hidden:
        out.print(Text(f"({hidden} stopped or dead not shown; use --all)", style="grey50"))
    out.print(_leader_line(leader))


# -- demo --------------------------------------------------------------------------------


@cli.command()
@friendly
def demo(
    database: Annotated[
        str | None,
        typer.Option(
            "--database",
            "-d",
            metavar="URL",
            help="Where the demo keeps its jobs. Default: a fresh sqlite:///.tether/demo.db.",
            show_default=False,
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            min=1, help="Stop on its own after this many seconds (for CI).", show_default=False
        ),
    ] = None,
    n_workers: Annotated[
        int, typer.Option("--workers", "-w", min=1, max=16, help="In-process workers.")
    ] = 2,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Jobs each worker runs at once.")
    ] = 3,
    port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="Serve the API and dashboard on 127.0.0.1 here (a free port if taken).",
        ),
    ] = 8000,
    web: Annotated[
        bool, typer.Option("--web/--no-web", help="Serve the API and dashboard.")
    ] = True,
) -> None:
    """Watch a crawl → chunk → embed → upsert pipeline run live, with retries and a cancel.

    It also serves the API and dashboard on 127.0.0.1 and prints their URL and a fresh
    admin token (it opens nothing by itself). Ctrl-C stops it gracefully: running jobs
    are released with their checkpoints.
    """
    from tether import demo as demo_mod

    code = demo_mod.main(
        database=database,
        duration=duration,
        workers=n_workers,
        concurrency=concurrency,
        console=out,
        port=port if web else None,
    )
    raise typer.Exit(code)


key_cli = typer.Typer(help="Concurrency keys and resource slots.", no_args_is_help=True)
cli.add_typer(key_cli, name="key")


@key_cli.command("list")
@friendly
def key_list(
    blocked: Annotated[
        bool, typer.Option(help="Only keys and resources that are blocked.")
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List concurrency keys and resource pools: what runs, what waits, and why it is blocked."""
    app = open_app(database, app_ref)
    limits = [
        lim for lim in run(app, app.limits()) if not blocked or lim.blocked_reason is not None
    ]
    if as_json:
        print_json([{**dataclasses.asdict(lim), "blocked": lim.blocked_reason} for lim in limits])
        return
    if not limits:
        out.print("no blocked keys" if blocked else "no keys or resources")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("name", "kind", "running", "capacity", "waiting", "blocked"):
        table.add_column(
            column, justify="right" if column in ("running", "capacity", "waiting") else "left"
        )
    for lim in limits:
        name = lim.name.split(":", 1)[1] if ":" in lim.name else lim.name
        reason = lim.blocked_reason
        table.add_row(
            name,
            lim.kind,
            str(lim.used),
            str(lim.capacity),
            str(lim.queued),
            Text(reason, style="yellow") if reason else "",
        )
    out.print(table)


@key_cli.command("configure")
@friendly
def key_configure(
    key: Annotated[str, typer.Argument(help="The concurrency key.", show_default=False)],
    max_running: Annotated[
        int, typer.Option(min=1, help="Jobs of this key that may run at once.")
    ] = 1,
    block_on_hold: Annotated[
        bool, typer.Option(help="Whether a paused or failed job under the key blocks it.")
    ] = True,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Set how many jobs of a key may run at once, and whether a held job blocks it."""
    app = open_app(database, app_ref)
    run(app, app.configure_key(key, max_running=max_running, block_on_hold=block_on_hold))
    out.print(f"key {key}: up to {max_running} running; blocked by held jobs: {block_on_hold}")


rate_cli = typer.Typer(
    help="Rate limits: how fast jobs of a queue or task may start, across every worker.",
    no_args_is_help=True,
)
cli.add_typer(rate_cli, name="rate-limit")

QueueTarget = Annotated[
    str | None, typer.Option("--queue", help="Limit this queue's jobs.", show_default=False)
]
TaskTarget = Annotated[
    str | None,
    typer.Option("--task", help="Limit this task's jobs, on every queue.", show_default=False),
]


@rate_cli.command("set")
@friendly
def rate_limit_set(
    per_second: Annotated[
        float,
        typer.Option(help="Jobs that may start per second, on average.", show_default=False),
    ],
    queue: QueueTarget = None,
    task: TaskTarget = None,
    burst: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Jobs that may start at once after a quiet spell (default: per-second, "
            "rounded up).",
            show_default=False,
        ),
    ] = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Limit how fast jobs of a queue (--queue) or a task (--task) start."""
    app = open_app(database, app_ref)
    run(app, app.rate_limit(queue=queue, task=task, per_second=per_second, burst=burst))
    target = f"queue {queue}" if queue is not None else f"task {task}"
    shown = burst if burst is not None else "default"
    out.print(f"{target}: at most {per_second:g} job(s)/s, bursts of {shown}")


@rate_cli.command("remove")
@friendly
def rate_limit_remove(
    queue: QueueTarget = None,
    task: TaskTarget = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Drop the rate limit of a queue (--queue) or a task (--task)."""
    app = open_app(database, app_ref)
    target = f"queue {queue}" if queue is not None else f"task {task}"
    if not run(app, app.remove_rate_limit(queue=queue, task=task)):
        fail(f"{target} has no rate limit")
    out.print(f"{target}: no rate limit")


@rate_cli.command("list")
@friendly
def rate_limit_list(
    database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False
) -> None:
    """List rate limits with the tokens (jobs that may start now) each holds."""
    app = open_app(database, app_ref)
    limits = run(app, app.rate_limits())
    if as_json:
        print_json(limits)
        return
    if not limits:
        out.print("no rate limits")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("scope", "name", "per second", "burst", "may start now"):
        table.add_column(col, justify="right" if col in ("per second", "burst") else "left")
    for r in limits:
        table.add_row(r.scope, r.name, f"{r.per_second:g}", str(r.burst), str(int(r.tokens)))
    out.print(table)


# -- API server, tokens and audit ---------------------------------------------------------


def _serve_metrics(host: str, port: int) -> None:
    from tether import metrics

    try:
        metrics.serve(port, host)
    except OSError as exc:
        fail(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}")
    logging.getLogger("tether.cli").info("metrics on http://%s:%d/metrics", host, port)


def _is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def _cli_actor() -> str:
    """Who the audit log names for a command: the local user."""
    from tether.audit import local_actor

    return local_actor("cli")


@cli.command()
@friendly
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    docs: Annotated[
        bool,
        typer.Option(
            "--docs",
            help="Serve the interactive API docs at /docs and /redoc (they load scripts "
            "from a CDN); /openapi.json is always served.",
        ),
    ] = False,
    hide_totals: Annotated[
        bool,
        typer.Option(
            "--hide-totals-from-members",
            help="Refuse members /api/stats, /api/queues and /api/keys (counts and names "
            "of every principal's jobs).",
        ),
    ] = False,
    pool_size: PoolSizeOpt = None,
) -> None:
    """Run the REST API, the dashboard (at /), live events, /metrics and /health under
    uvicorn.

    Requests need a token from `tether token create`. While no token exists, it refuses
    to listen on anything but a loopback address, and on loopback every request acts as
    an admin (it says so loudly). Pass --app to enqueue jobs through the API: the server
    checks them against the app's tasks.
    """
    level = logging.getLevelNamesMapping().get(log_level.upper())
    if level is None:
        fail(f"unknown --log-level {log_level!r}: use debug, info, warning or error", EXIT_USAGE)
    from tether.auth import Tokens

    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    app = open_app(database, app_ref)
    set_pool_size(app, pool_size, default=SERVE_POOL_SIZE)
    has_tokens = run(app, Tokens(app).any_active())
    loopback = _is_loopback(host)
    if not has_tokens and not loopback:
        fail(
            f"refusing to listen on {host}: no API token exists, so anyone who reaches the "
            "server could act as admin. Create one first: tether token create --name NAME "
            "--role admin",
            EXIT_USAGE,
        )
    if not has_tokens:
        err.print(
            Panel(
                f"No API token exists: [bold]anyone who can reach {host}:{port} acts as "
                "admin[/]. Create a token (tether token create --name NAME --role admin) to "
                "require tokens.",
                title="tether serve is OPEN",
                style="bold red",
            )
        )
    logging.getLogger("tether.cli").info("database %s", display.redact_url(app.url))
    import uvicorn  # imported late: a refusal above should be quick

    from tether.web import ApiSettings, create_app
    from tether.web.app import server_config

    settings = ApiSettings(allow_anonymous=loopback, docs=docs, members_see_totals=not hide_totals)
    api = create_app(app, settings)
    uvicorn.Server(server_config(api, host, port, settings, log_level=level)).run()


token_cli = typer.Typer(help="API tokens: create, list and revoke.", no_args_is_help=True)
cli.add_typer(token_cli, name="token")


@token_cli.command("create")
@friendly
def token_create(
    name: Annotated[
        str,
        typer.Option(
            "--name",
            "-n",
            help="Who the token stands for; it owns the jobs it enqueues.",
            show_default=False,
        ),
    ],
    role: Annotated[
        str, typer.Option("--role", "-r", help="admin, member or viewer.", show_default=False)
    ],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create an API token and print it once: tether keeps only its hash."""
    from tether.audit import Audit
    from tether.auth import Tokens

    app = open_app(database, app_ref)

    async def go() -> tuple[str, TokenInfo]:
        token, info = await Tokens(app).create(name, role)
        await Audit(app).record(_cli_actor(), "token.create", f"token:{name}", "ok",
                                detail=f"role {info.role}")  # fmt: skip
        return token, info

    token, info = run(app, go())
    if as_json:
        print_json({"name": info.name, "role": info.role, "token": token})
        return
    err.print(f"created {info.role} token {info.name!r}:")
    typer.echo(token)  # alone on stdout, so scripts can capture it
    err.print(
        Text(
            "store it now: it is shown only this once, and tether keeps only its hash",
            style="yellow",
        )
    )


@token_cli.command("list")
@friendly
def token_list(
    database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False
) -> None:
    """List tokens (names, roles and ages; never the tokens themselves)."""
    from tether.auth import Tokens

    app = open_app(database, app_ref)
    tokens = run(app, Tokens(app).list())
    if as_json:
        print_json(
            [
                {
                    "name": t.name,
                    "role": t.role,
                    "created_at": t.created_at,
                    "revoked_at": t.revoked_at,
                }
                for t in tokens
            ]
        )
        return
    if not tokens:
        out.print("no tokens (tether serve answers only on loopback, as an open admin)")
        return
    now = now_utc()
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("name", "role", "created", "status"):
        table.add_column(col)
    for t in tokens:
        status = (
            Text("active", style="green")
            if t.revoked_at is None
            else Text(f"revoked {display.age(t.revoked_at, now)} ago", style="grey50")
        )
        table.add_row(t.name, t.role, display.age(t.created_at, now) + " ago", status)
    out.print(table)


@token_cli.command("revoke")
@friendly
def token_revoke(
    name: Annotated[str, typer.Argument(help="The token's name.", show_default=False)],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Revoke a token at once: the next request that sends it gets 401."""
    from tether.audit import Audit
    from tether.auth import Tokens

    app = open_app(database, app_ref)

    async def go() -> bool:
        done = await Tokens(app).revoke(name)
        await Audit(app).record(
            _cli_actor(), "token.revoke", f"token:{name}", "ok" if done else "not_found"
        )
        return done

    if not run(app, go()):
        fail(f"no active token named {name!r}")
    out.print(f"token {name!r} revoked")


@cli.command()
@friendly
def audit(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many.")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many (newest first).")] = 0,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the audit log, newest first: every change and every denied attempt."""
    from tether.audit import Audit

    app = open_app(database, app_ref)
    rows = run(app, Audit(app).list(limit, offset))
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("the audit log is empty")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("at", "actor", "action", "target", "result", "request", "detail"):
        table.add_column(col, overflow="fold", no_wrap=col in ("at", "result"))
    for row in rows:
        table.add_row(
            row.at.strftime("%Y-%m-%d %H:%M:%S"),
            row.actor,
            row.action,
            row.target or "",
            Text(row.result, style="green" if row.result == "ok" else "red"),
            row.request_id or "",
            row.detail or "",
        )
    out.print(table)


# -- maintenance: the leader, retention -------------------------------------------------


async def _workers_and_leader(app: App) -> tuple[list[WorkerInfo], LeaderInfo | None]:
    return await app.workers(), await app.leader()


def _leader_line(leader: LeaderInfo | None) -> Text:
    if leader is None:
        return Text("maintenance leader: none yet (no worker has run)", style="grey50")
    if not leader.active:
        return Text(
            f"maintenance leader: none (the lease of {leader.holder} ran out; "
            "another worker takes it within seconds)",
            style="yellow",
        )
    return Text(f"maintenance leader: {leader.holder} (prunes and fires schedules)")


def retention_from(base: RetentionConfig, specs: list[str]) -> RetentionConfig:
    """``base`` with ``KIND=AGE`` overrides (``AGE`` may be ``forever``)."""
    kinds = ("succeeded", "failed", "cancelled", "audit", "workers")
    changes: dict[str, float | None] = {}
    for spec in specs:
        kind, sep, age = spec.partition("=")
        kind = kind.strip().lower()
        if not sep or kind not in kinds:
            raise ConfigError(
                f"bad --retain {spec!r}: use KIND=AGE with KIND one of {', '.join(kinds)}"
            )
        changes[kind] = None if age.strip().lower() == "forever" else parse_age(age)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@cli.command()
@friendly
def prune(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="AGE",
            help="Prune finished jobs older than this (e.g. 12h, 7d) instead of each "
            "state's retention.",
            show_default=False,
        ),
    ] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            "-s",
            help="Only jobs in this final state: succeeded, failed or cancelled "
            "(repeatable). Audit and worker rows are then left alone.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would go; delete nothing.")
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete finished jobs, old audit rows and gone workers now, in small batches.

    Without options this applies the app's retention (succeeded 1 day, failed and
    cancelled 7 days, audit 90 days, stopped and dead workers 7 days), as the workers'
    maintenance leader does every minute. A job goes with its events, dependency links,
    artifacts and cancellation records; jobs in a workflow with an active member stay.
    """
    age = parse_age(older_than) if older_than is not None else None
    app = open_app(database, app_ref)
    verb = "would delete" if dry_run else "deleted"
    shown = [0.0]

    def progress(what: str, report: PruneReport) -> None:
        # At most a line a second: a big backlog takes hundreds of batches.
        if not as_json and time.monotonic() - shown[0] >= 1.0:
            shown[0] = time.monotonic()
            err.print(
                Text(
                    f"{what}: {report.counts.get('jobs', 0)} jobs, {report.total} rows so far",
                    style="grey50",
                )
            )

    report = run(app, app.prune(older_than=age, states=state, dry_run=dry_run, progress=progress))
    if as_json:
        print_json({"dry_run": dry_run, "counts": report.counts, "kept": report.kept})
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("kind")
    table.add_column(verb, justify="right")
    for kind, n in report.counts.items():
        table.add_row(kind, str(n))
    out.print(table)
    if report.kept:
        out.print(
            Text(f"{report.kept} old job(s) kept: their workflow is still active", style="grey50")
        )


schedule_cli = typer.Typer(help="Periodic schedules: list, pause and resume.", no_args_is_help=True)
cli.add_typer(schedule_cli, name="schedule")


@schedule_cli.command("list")
@friendly
def schedule_list(
    database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False
) -> None:
    """List schedules with their next tick, the last tick dealt with and the last job.

    With --app, the app's schedules are listed even before a worker has seen them.
    """
    app = open_app(database, app_ref)
    rows = run(app, app.list_schedules())
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no schedules (declare them with @app.periodic(cron=...))")
        return
    now = now_utc()

    def stamp(at: datetime | None, future: bool = False) -> str:
        if at is None:
            return "-"
        span = display.duration(abs((at - now).total_seconds()))
        return f"{at.strftime('%Y-%m-%d %H:%M:%S')} ({'in ' + span if future else span + ' ago'})"

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("name", "cron", "tz", "state", "next run", "last tick", "last run", "last job"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r.name,
            r.cron,
            r.timezone,
            Text("paused", style="yellow") if r.paused else Text("active", style="green"),
            "-" if r.paused else stamp(r.next_tick, future=True),
            stamp(r.last_tick),
            stamp(r.last_run_at),
            str(r.last_job_id) if r.last_job_id is not None else "-",
        )
    out.print(table)


@schedule_cli.command("pause")
@friendly
def schedule_pause(
    name: Annotated[str, typer.Argument(help="The schedule's name (see `schedule list`).")],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Stop enqueueing a schedule's ticks; ticks that pass meanwhile are skipped."""
    app = open_app(database, app_ref)
    run(app, app.pause_schedule(name))
    out.print(f"[green]✓[/] schedule {escape(name)} paused")


@schedule_cli.command("resume")
@friendly
def schedule_resume(
    name: Annotated[str, typer.Argument(help="The schedule's name (see `schedule list`).")],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Enqueue a paused schedule's ticks again, from its next tick on."""
    app = open_app(database, app_ref)
    run(app, app.resume_schedule(name))
    out.print(f"[green]✓[/] schedule {escape(name)} resumed")


def main() -> None:
    """Entry point of the ``tether`` script."""
    cli()
