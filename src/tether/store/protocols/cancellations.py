"""Cancellation records."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tether.job import CancellationRow


@runtime_checkable
class CancellationStore(Protocol):
    """Cancellation records: one per cancelled job, created when a cancellation starts
    and settled when it ends (the jobs themselves change through :class:`JobStore`)."""

    async def create_cancellation(
        self,
        cancellation_id: str,
        *,
        job_id: int,
        request_id: str | None,
        reason: str | None,
        force: bool,
        cascade: bool,
        initiated_by: str | None,
    ) -> tuple[CancellationRow, bool]:
        """Create the job's cancellation record, or return the existing one (``False``)."""

    async def update_cancellation(
        self,
        cancellation_id: str,
        *,
        status: str,
        steps: list[dict[str, object]],
        result: dict[str, object] | None,
        error: str | None,
        final: bool,
        expect: str | None = None,
    ) -> bool:
        """Record a cancellation's progress; ``final`` stamps its completion.

        With ``expect``, only while the record's status is still ``expect`` (whoever
        drives a record checks that nobody else settled it meanwhile). Returns whether
        the record was written.
        """

    async def get_cancellation(
        self, *, job_id: int | None, request_id: str | None
    ) -> CancellationRow | None:
        """The cancellation record of a job, or with a request id."""

    async def list_cancellations(
        self, *, limit: int, offset: int, status: str | None = None
    ) -> list[CancellationRow]:
        """Cancellation records, newest first (only those with ``status``, if given)."""

    async def list_stale_cancellations(
        self, *, older_than: float, limit: int
    ) -> list[CancellationRow]:
        """Records not settled yet that were started more than ``older_than`` seconds ago
        (database time), oldest first."""

    async def list_owned_cancellations(
        self, owner: str, *, limit: int, offset: int
    ) -> list[CancellationRow]:
        """Cancellation records of the jobs ``owner`` enqueued, newest first."""
