"""Jobs and workflows: enqueue, read, steer, follow their links."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tether.job import ArtifactInfo, Job, JobEvent, JobFilter, NewJob
from tether.store.protocols.listen import ListenStore


@runtime_checkable
class JobStore(ListenStore, Protocol):
    """Jobs and workflows, as producers and operators see them: enqueue (with
    dependencies), read, steer (cancel, pause, resume, retry, delete), follow the
    links between a workflow's jobs, and read the artifacts jobs saved."""

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Job]:
        """Insert jobs in one transaction. A known idempotency key returns the existing job.

        The key answers first, as a retried request expects: an entry whose key exists
        gets that job as it is, and nothing else about the entry is checked again (not
        even dependencies that have since been cancelled).
        """

    async def get(self, job_id: int) -> Job | None:
        """One job, or ``None``."""

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        """Jobs matching ``flt``, newest first."""

    async def count_by_state(self) -> dict[str, int]:
        """Number of jobs in each state (states with none are left out)."""

    async def events(self, job_id: int) -> list[JobEvent]:
        """A job's transitions, oldest first."""

    async def request_cancel(
        self,
        job_id: int,
        reason: str | None,
        force: bool,
        actor: str | None,
        cascade: bool = True,
    ) -> Job:
        """Cancel a job that is not running at once; flag a running one.

        Returns the job after the change. A terminal job is returned unchanged, so the
        caller can say what happened. Raises ``JobNotFoundError``.
        """

    async def request_pause(self, job_id: int, reason: str | None, actor: str | None) -> Job:
        """Pause a queued or retrying job at once; flag a running one. Others unchanged."""

    async def resume(self, job_id: int, budget: int | None, actor: str | None) -> Job:
        """Queue a paused job again (or withdraw a pending pause). Others unchanged."""

    async def retry(self, job_id: int, actor: str | None) -> Job:
        """Queue a failed job again with fresh attempts. Others unchanged."""

    async def delete(self, job_id: int, actor: str | None) -> tuple[Job, list[Job]]:
        """Delete a job, cancelling its active children first; returns the job as it was
        and the children cancelled."""

    async def downstream(self, job_ids: Sequence[int]) -> list[Job]:
        """Every job reachable from these through dependencies and children."""

    async def dependencies(self, job_id: int) -> tuple[list[int], list[int]]:
        """The ids a job depends on, and the ids that depend on it."""

    async def list_artifacts(self, job_id: int) -> list[ArtifactInfo]:
        """A job's artifacts (without their bytes)."""

    async def get_artifact(self, job_id: int, name: str) -> bytes | None:
        """One artifact's bytes."""
