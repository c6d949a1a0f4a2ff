"""The audit log: one row per mutation and per denied attempt, in database time."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tether.job import AuditEntry

if TYPE_CHECKING:
    from tether.app import App

log = logging.getLogger("tether.audit")
MAX_FIELD = 500  # characters kept of free text (targets, details)


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
