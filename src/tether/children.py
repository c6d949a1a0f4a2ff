"""A job's children: the jobs it spawned, read by ``app.jobs.children`` and by a
running handler's :meth:`~tether.JobContext.children`."""

from __future__ import annotations

from tether.job import Job, JobFilter
from tether.store.protocols import JobStore

# Every child at once: a parent waits on all of them, however many it spawned.
ALL = 100_000


async def children(store: JobStore, job_id: int) -> list[Job]:
    """The jobs ``job_id`` spawned, oldest first."""
    flt = JobFilter(parent_id=job_id, limit=ALL)
    return sorted(await store.list_jobs(flt), key=lambda j: j.id)
