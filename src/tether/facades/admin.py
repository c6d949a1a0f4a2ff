"""``app.admin``: operating the database and the fleet: connecting and listening, the
schema and its migrations, pruning, the maintenance leader, workers, and the jobs that
no live worker can run."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tether import serving
from tether.audit import audited
from tether.errors import InvalidJobError
from tether.facades.base import Facade
from tether.job import WorkerInfo
from tether.ops import MAINTENANCE, LeaderInfo, PruneReport
from tether.schema import ensure_schema
from tether.states import TERMINAL, JobState
from tether.store import create_store, parse_sqlite_path
from tether.store.base import shipped_versions


class Admin(Facade):
    """The database and the fleet: schema, migrations, retention, leader, workers."""

    @staticmethod
    def sqlite_file(url: str) -> str | None:
        """The file a ``sqlite:`` database URL names (``None`` for PostgreSQL); a
        malformed or unsupported URL raises :class:`~tether.errors.ConfigError`."""
        create_store(url)
        return parse_sqlite_path(url) if url.startswith("sqlite:") else None

    async def listen(self) -> None:
        """Connect this event loop's store now and, on PostgreSQL, listen for its
        notifications, so waits and feeds wake as soon as a job changes."""
        store = await self._store()
        await store.listen()

    async def schema_version(self) -> int:
        """The newest migration applied to the database (connecting first)."""
        store = await self._store()
        return await store.schema_version()

    async def missing_migrations(self) -> list[int]:
        """The migrations this code ships that the database lacks (gaps included)."""
        store = await self._store()
        applied = await store.applied_migrations()
        return sorted(shipped_versions(self.app.url) - applied)

    def expected_schema_version(self) -> int:
        """The newest migration this code ships for the App's database."""
        return max(shipped_versions(self.app.url))

    async def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied (warns if the
        database is newer than this code)."""
        store = create_store(self.app.url, self.app.config.store)
        try:
            await store.open()
            return await ensure_schema(store, migrate=True)
        finally:
            await store.close()

    @audited("retention.prune", lambda a: "jobs (dry run)" if a["dry_run"] else "jobs")
    async def prune(
        self,
        *,
        older_than: float | None = None,
        states: Sequence[JobState | str] | None = None,
        dry_run: bool = False,
        progress: Callable[[str, PruneReport], None] | None = None,
    ) -> PruneReport:
        """Delete finished jobs (with their events, links, artifacts and cancellation
        records), old audit rows and gone worker rows after ``config.retention``, now.

        ``states`` limits it to jobs in those final states (and leaves audit and worker
        rows alone); ``older_than`` (seconds) replaces each state's retention;
        ``dry_run`` counts what would go and deletes nothing. Workers' maintenance
        leader does the same on its own every ``retention.interval`` seconds.
        """
        from tether.maintenance.pruner import Pruner

        if older_than is not None and older_than < 0:
            raise InvalidJobError("older_than must not be negative")
        names: list[str] | None = None
        if states is not None:
            try:
                parsed = [JobState(s) for s in states]
            except ValueError as exc:
                raise InvalidJobError(f"unknown state in {list(states)!r}") from exc
            if any(s not in TERMINAL for s in parsed):
                raise InvalidJobError(
                    "only finished jobs are pruned: use succeeded, failed or cancelled"
                )
            names = [s.value for s in parsed]
        pruner = Pruner(await self._store(), self.app.config.retention)
        return await pruner.prune(
            states=names, older_than=older_than, dry_run=dry_run, progress=progress
        )

    async def leader(self) -> LeaderInfo | None:
        """The worker that leads maintenance (pruning, schedules), if one holds the lease."""
        store = await self._store()
        return await store.get_leader(MAINTENANCE)

    async def workers(self) -> list[WorkerInfo]:
        """Known workers, newest first."""
        store = await self._store()
        return await store.list_workers()

    async def unserved(self) -> list[serving.Unserved]:
        """Waiting jobs that no live worker can run, by queue and task, with why."""
        store = await self._store()
        waiting = await store.waiting_by_task()
        if not waiting:
            return []
        workers = serving.live(await store.list_workers())
        found = []
        for (queue, task), n in sorted(waiting.items()):
            why = serving.reason(queue, task, workers)
            if why is not None:
                found.append(serving.Unserved(queue, task, n, why))
        return found
