"""What every facade of the App shares: the App it belongs to, and its store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tether.job import Job

if TYPE_CHECKING:
    from tether.app import App
    from tether.store import Store


def job_target(args: dict[str, Any]) -> str:
    """The audit target of a call about one job."""
    return f"job:{args['job_id']}"


class Facade:
    """One part of an :class:`~tether.App`'s API, reached as an attribute of the App
    (``app.jobs``, ``app.queues``...). ``app`` is the App: its mutations are audited
    under the App's ``actor``."""

    def __init__(self, app: App) -> None:
        self.app = app

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.app!r}>"

    async def _store(self) -> Store:
        """The App's store for the running event loop."""
        return await self.app.store()

    async def _job(self, job_id: int) -> Job:
        """The job with this id; raises :class:`~tether.errors.JobNotFoundError`."""
        return await self.app.get(job_id)
