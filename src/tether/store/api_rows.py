"""Turning the API's rows (tokens, audit log, feed) into records; shared by both stores."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from tether.job import AuditEntry, FeedEvent, TokenInfo
from tether.store.rows import RowReader, epoch_to_dt

Row = Mapping[str, Any]


class ApiRowReader:
    """Builds token, audit and feed records, given how a dialect stores times."""

    def __init__(self, rows: RowReader, *, epoch_times: bool) -> None:
        self._rows = rows
        self._time: Callable[[Any], datetime | None] = epoch_to_dt if epoch_times else (lambda v: v)

    def _at(self, value: Any) -> datetime:
        at = self._time(value)
        assert at is not None
        return at

    def token(self, row: Row) -> TokenInfo:
        """A :class:`TokenInfo` from a ``tether_tokens`` row."""
        return TokenInfo(
            id=row["id"],
            name=row["name"],
            role=row["role"],
            created_at=self._at(row["created_at"]),
            revoked_at=self._time(row["revoked_at"]),
            token_hash=row["token_hash"],
        )

    def audit(self, row: Row) -> AuditEntry:
        """An :class:`AuditEntry` from a ``tether_audit`` row."""
        return AuditEntry(
            id=row["id"],
            at=self._at(row["at"]),
            actor=row["actor"],
            action=row["action"],
            target=row["target"],
            result=row["result"],
            request_id=row["request_id"],
            detail=row["detail"],
        )

    def feed(self, row: Row) -> FeedEvent:
        """A :class:`FeedEvent` from an event row joined with its job's queue, task, owner."""
        return FeedEvent(
            event=self._rows.event(row),
            queue=row["job_queue"],
            task=row["job_task"],
            owner=row["job_owner"],
        )
