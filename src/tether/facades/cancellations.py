"""``app.cancellations``: the records that cancellations by request leave, and waiting
for one to finish. Cancelling is :meth:`tether.App.cancel`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether.cancellation import CancellationRecord, CancellationService, record_from_row
from tether.facades.base import Facade

if TYPE_CHECKING:
    from tether.app import App


async def service(app: App) -> CancellationService:
    """The cancellation service over ``app``'s store, with its configuration."""
    return CancellationService(
        await app.store(),
        app.config.wait_poll_interval,
        adopt_after=app.config.cancellation_adopt_after,
        retry=app.config.cancellation_retry,
    )


class Cancellations(Facade):
    """Cancellation records: one per job cancelled by request, saying how it went."""

    async def get(self, job_id: int) -> CancellationRecord | None:
        """The job's cancellation record, if it was ever cancelled by request."""
        await self._job(job_id)
        store = await self._store()
        row = await store.get_cancellation(job_id=job_id, request_id=None)
        return record_from_row(row) if row is not None else None

    async def owned_by(
        self, owner: str, limit: int = 20, offset: int = 0
    ) -> list[CancellationRecord]:
        """Cancellation records of the jobs ``owner`` enqueued, newest first."""
        store = await self._store()
        rows = await store.list_owned_cancellations(owner, limit=limit, offset=offset)
        return [record_from_row(r) for r in rows]

    async def wait(self, job_id: int, timeout: float) -> tuple[bool, list[str]]:
        """Wait until the job's cancellation has finished and its job has stopped, or
        ``timeout``; return ``(success, errors)``.

        A record that settled ``partial`` because its job still ran (``cancel(wait=0)``)
        is completed as soon as the job stops, so an error that no longer holds is not
        reported. Event-driven (NOTIFY on PostgreSQL, in-process hints otherwise,
        polling as the fallback); a cancellation that already finished is answered at once.
        """
        await self._job(job_id)
        cancellations = await service(self.app)
        record = await cancellations.wait_settled(job_id, timeout)
        if record is None:
            return False, [f"job {job_id} has no cancellation"]
        if not record.settled:
            return False, [f"cancellation {record.id} is still {record.status} after {timeout}s"]
        return record.status == "completed", record.errors

    # Last: below it, ``list`` in the class body would name this method, not the type.
    async def list(self, limit: int = 20, offset: int = 0) -> list[CancellationRecord]:
        """Cancellation records, newest first."""
        store = await self._store()
        rows = await store.list_cancellations(limit=limit, offset=offset)
        return [record_from_row(r) for r in rows]
