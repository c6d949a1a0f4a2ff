"""The audit log: one row per mutation and per denied attempt, in database time.

Every mutation made through an :class:`~tether.App` (the Python API, and the CLI, which
uses it) leaves a row naming the App's ``actor``. The REST API and the dashboard write
their own rows (with the principal, the request id and denied attempts) and mark the
block they run in with :func:`by_caller`, so the App does not write a second one.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import getpass
import inspect
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from tether.job import AuditEntry
from tether.store import caller_store
from tether.store.protocols import AuthStore

if TYPE_CHECKING:
    from tether.app import App

log = logging.getLogger("tether.audit")
MAX_FIELD = 500  # characters kept of free text (targets, details)
P = ParamSpec("P")
R = TypeVar("R")

_caller_audits: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tether_caller_audits", default=False
)


@contextlib.contextmanager
def by_caller() -> Iterator[None]:
    """Within this block the caller audits what it does; the App writes no row."""
    token = _caller_audits.set(True)
    try:
        yield
    finally:
        _caller_audits.reset(token)


def caller_audits() -> bool:
    """Whether the running code is inside :func:`by_caller`."""
    return _caller_audits.get()


def local_actor(prefix: str) -> str:
    """``prefix:user``, naming the operating-system user (``prefix`` alone if unknown)."""
    try:
        return f"{prefix}:{getpass.getuser()}"
    except Exception:  # no user name in some containers
        return prefix


class Audit:
    """Writes and reads the audit log of an :class:`~tether.App`'s database."""

    def __init__(self, app: App, connection: object | None = None) -> None:
        self.app = app
        self.connection = connection

    async def record(
        self,
        actor: str,
        action: str,
        target: str | None,
        result: str,
        *,
        request_id: str | None = None,
        detail: str | None = None,
    ) -> AuditEntry:
        """Append one row. ``result`` is ``ok``, ``denied`` or an error code."""
        store: AuthStore = (
            caller_store(self.app.url, self.connection)
            if self.connection is not None
            else await self.app.store()
        )
        entry = await store.append_audit(
            actor[:MAX_FIELD],
            action[:MAX_FIELD],
            target[:MAX_FIELD] if target is not None else None,
            result[:MAX_FIELD],
            request_id,
            detail[:MAX_FIELD] if detail is not None else None,
        )
        log.debug("audit %s %s %s: %s", actor, action, target, result)
        return entry

    async def list(self, limit: int = 50, offset: int = 0) -> list[AuditEntry]:
        """Rows, newest first."""
        store: AuthStore = await self.app.store()
        return await store.list_audit(limit, offset)


def audited(
    action: str,
    target: Callable[[dict[str, Any]], str],
    *,
    done: Callable[[Any], str] | None = None,
    connection: Callable[[dict[str, Any]], object | None] | None = None,
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Audit a method of an :class:`~tether.App` or of one of its facades (whose ``app``
    is the App): one row as the call's ``actor`` argument (or the App's ``actor``),
    ``ok`` or ``failed`` with the error, and its ``reason`` as the detail. ``target``
    names what the arguments point at; ``done`` may name it better from the result (the
    new job). ``connection`` finds the caller's connection in the arguments, if any: the
    row then joins the caller's transaction, so it commits or rolls back with the change
    it records. No row inside :func:`by_caller`."""

    def wrap(method: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        signature = inspect.signature(method)

        @functools.wraps(method)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            if caller_audits():
                return await method(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            params = bound.arguments
            owner = params["self"]
            app: App = getattr(owner, "app", owner)
            actor = params.get("actor") or app.actor
            reason = params.get("reason")
            conn = connection(params) if connection is not None else None
            try:
                result = await method(*args, **kwargs)
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
                await _write(app, conn, actor, action, target(params), "failed", why)
                raise
            named = done(result) if done is not None else target(params)
            await _write(app, conn, actor, action, named, "ok", reason)
            return result

        return run

    return wrap


async def _write(
    app: App,
    connection: object | None,
    actor: str,
    action: str,
    target: str,
    result: str,
    detail: str | None,
) -> None:
    # The change stands whether or not its row is written: log a failure, never raise.
    try:
        await Audit(app, connection).record(actor, action, target, result, detail=detail)
    except Exception as exc:
        log.error("audit row not written (%s %s %s): %s", action, target, result, exc)
