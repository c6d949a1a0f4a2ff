"""What every command shares: its options, how it opens the App, runs, and fails.

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
import dataclasses
import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import typer
from rich.markup import escape

from tether import display
from tether.app import App
from tether.cli.output import err
from tether.config import DEFAULT_DATABASE_URL, DEFAULT_POOL_SIZE, SERVE_POOL_SIZE
from tether.errors import ConfigError, InvalidJobError, StoreError, TetherError
from tether.facades import Admin

P = ParamSpec("P")
T = TypeVar("T")

EXIT_FAILED = 1
EXIT_USAGE = 2

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
LimitOpt = Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many.")]
OffsetOpt = Annotated[int, typer.Option(min=0, help="Skip this many (newest first).")]
JobIdArg = Annotated[int, typer.Argument(help="The job id.", show_default=False)]
LogLevelOpt = Annotated[str, typer.Option(help="debug, info, warning or error.")]

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


def parse_log_level(name: str) -> int:
    """The logging level ``--log-level`` names; a bad name is a usage error."""
    level = logging.getLevelNamesMapping().get(name.upper())
    if level is None:
        fail(f"unknown --log-level {name!r}: use debug, info, warning or error", EXIT_USAGE)
    return level


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
            # before any call is enough; sqlite_file validates it as the App would.
            Admin.sqlite_file(database)
            app.url = database
    else:
        app = App(database)
    if not create and (database or not app_ref):
        # Nor does it create tether's tables in a PostgreSQL database that has none (a
        # typo naming another application's database): `tether migrate` does that.
        app.config = dataclasses.replace(app.config, auto_migrate=False)
    # Every change a command makes is audited in the name of the local user.
    app.actor = cli_actor()
    _opened.append(app.url)
    return app


def _require_database(url: str) -> None:
    """Refuse a SQLite URL whose file does not exist."""
    path = Admin.sqlite_file(url)  # a malformed URL gets its own clear error first
    if path is not None and not os.path.exists(path):
        _opened.append(url)
        raise StoreError(
            f"no SQLite database at {path}: check --database (`tether migrate` or a "
            "worker creates one)"
        )


def cli_actor() -> str:
    """Who the audit log names for a command: the local user."""
    from tether.audit import local_actor

    return local_actor("cli")


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


def now_utc() -> datetime:
    """The local clock as an aware UTC time, for display ages only."""
    return datetime.now(UTC)


def resolve_task(app: App, name: str) -> str:
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
