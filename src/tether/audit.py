"""The audit log: one row per mutation and per denied attempt, in database time.

Every mutation made through an :class:`~tether.App` (the Python API, and the CLI, which
uses it) leaves a row naming the App's ``actor``. The REST API and the dashboard write
their own rows (with the principal, the request id and denied attempts) and mark the
block they run in with :func:`by_caller`, so the App does not write a second one.
"""

from __future__ import annotations

import contextlib
import contextvars
import getpass
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tether.job import AuditEntry

if TYPE_CHECKING:
    from tether.app import App

log = logging.getLogger("tether.audit")
MAX_FIELD = 500  # characters kept of free text (targets, details)

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

    def __init__(self, app: App) -> None:
        self.app = app

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
        entry = await (await self.app.store()).append_audit(
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
        return await (await self.app.store()).list_audit(limit, offset)
