"""``app.jobs``: reading jobs (lists, events, links, artifacts, counts, the live feed)
and steering one job (pause, resume, retry, delete)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence

from tether import children, job_meta, serving
from tether.audit import audited
from tether.errors import IllegalTransitionError, InvalidJobError, JobNotFoundError
from tether.facades.base import Facade, job_target
from tether.feed import FeedFilter, follow
from tether.job import ArtifactInfo, FeedEvent, Job, JobEvent, JobFilter
from tether.joblog import LogLine
from tether.states import JobState


class Jobs(Facade):
    """Jobs: read them, and pause, resume, retry or delete one (each change audited).
    Enqueueing, :meth:`~tether.App.get`, :meth:`~tether.App.wait` and
    :meth:`~tether.App.cancel` are the App's own."""

    async def events(self, job_id: int) -> list[JobEvent]:
        """The job's transitions, oldest first."""
        await self._job(job_id)
        store = await self._store()
        return await store.events(job_id)

    async def stats(self) -> dict[str, int]:
        """Number of jobs in each state, every state present."""
        store = await self._store()
        counts = await store.count_by_state()
        return {s.value: counts.get(s.value, 0) for s in JobState}

    async def children(self, job_id: int) -> list[Job]:
        """The jobs ``job_id`` spawned, oldest first."""
        return await children.children(await self._store(), job_id)

    async def dependencies(self, job_id: int) -> tuple[list[int], list[int]]:
        """``(upstream, downstream)``: the ids a job depends on, and the ids that depend on it."""
        await self._job(job_id)
        store = await self._store()
        return await store.dependencies(job_id)

    async def downstream(self, job_id: int) -> list[Job]:
        """Every job that depends on ``job_id`` or descends from it, transitively."""
        store = await self._store()
        return await store.downstream([job_id])

    async def artifacts(self, job_id: int) -> list[ArtifactInfo]:
        """The artifacts a job saved."""
        await self._job(job_id)
        store = await self._store()
        return await store.list_artifacts(job_id)

    async def artifact(self, job_id: int, name: str) -> bytes:
        """One artifact's bytes; raises :class:`LookupError` if there is none."""
        store = await self._store()
        data = await store.get_artifact(job_id, name)
        if data is None:
            raise (
                JobNotFoundError(job_id)
                if await store.get(job_id) is None
                else (LookupError(f"job {job_id} has no artifact named {name!r}"))
            )
        return data

    async def logs(self, job_id: int, *, after: int = 0, limit: int = 1000) -> list[LogLine]:
        """The lines of the job's own log (``ctx.log``) with a ``seq`` above ``after``,
        in order, at most ``limit``; :class:`JobNotFoundError` for an unknown job."""
        await self._job(job_id)
        store = await self._store()
        return await store.logs(job_id, after=after, limit=limit)

    async def feed(
        self, flt: FeedFilter, *, after_id: int | None = None, poll: float = 1.0
    ) -> AsyncGenerator[FeedEvent, None]:
        """The live feed: transitions matching ``flt`` as they happen, oldest first,
        forever (see :func:`tether.feed.follow`); ``after_id`` resumes after that event id."""
        return follow(await self._store(), flt, after_id=after_id, poll=poll)

    async def unserved_reason(self, job: Job) -> str | None:
        """Why no live worker can run this waiting job (``None``: one can, or the job is
        not waiting to run)."""
        if job.state not in (JobState.QUEUED, JobState.RETRYING):
            return None
        store = await self._store()
        workers = serving.live(await store.list_workers())
        return serving.reason(job.queue, job.task, workers)

    @audited("job.pause", job_target)
    async def pause(
        self, job_id: int, *, reason: str | None = None, actor: str | None = None
    ) -> Job:
        """Pause a job: at once if it waits to run, at its next checkpoint if running.

        A paused job keeps its checkpoint; :meth:`resume` queues it again. Pausing a job
        that is blocked or finished raises :class:`IllegalTransitionError`.
        """
        before = await self._job(job_id)
        if before.state not in (
            JobState.QUEUED,
            JobState.RETRYING,
            JobState.RUNNING,
            JobState.PAUSED,
        ):
            raise IllegalTransitionError(job_id, before.state.value, "pause")
        store = await self._store()
        return await store.request_pause(job_id, reason, actor)

    @audited("job.resume", job_target)
    async def resume(
        self, job_id: int, *, budget: int | None = None, actor: str | None = None
    ) -> Job:
        """Queue a paused job again (optionally with a new budget); it continues from its
        checkpoint. Withdraws a pause that a running job has not acted on yet."""
        if budget is not None and budget <= 0:
            raise InvalidJobError(f"budget must be positive, got {budget}")
        before = await self._job(job_id)
        pausing = before.state is JobState.RUNNING and before.pause_requested_at is not None
        if before.state is not JobState.PAUSED and not pausing:
            raise IllegalTransitionError(job_id, before.state.value, "resume")
        store = await self._store()
        return await store.resume(job_id, budget, actor)

    @audited("job.retry", job_target)
    async def retry(self, job_id: int, *, actor: str | None = None) -> Job:
        """Queue a failed job again with a fresh set of attempts."""
        before = await self._job(job_id)
        if before.state is not JobState.FAILED:
            raise IllegalTransitionError(job_id, before.state.value, "retry")
        store = await self._store()
        return await store.retry(job_id, actor)

    @audited("job.delete", job_target)
    async def delete(self, job_id: int, *, actor: str | None = None) -> list[Job]:
        """Delete a job. Its active children are cancelled first ("parent job deleted");
        children that already ended are kept. Returns the children cancelled."""
        store = await self._store()
        _, cancelled = await store.delete(job_id, actor)
        return cancelled

    # Last: below it, ``list`` in the class body would name this method, not the type.
    async def list(
        self,
        *,
        state: JobState | str | Sequence[JobState | str] | None = None,
        queue: str | None = None,
        task: str | None = None,
        key: str | None = None,
        owner: str | None = None,
        worker_id: str | None = None,
        parent_id: int | None = None,
        meta: Mapping[str, str] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Job]:
        """Jobs, newest first, filtered; ``meta``: those whose meta holds each of its
        keys with its value."""
        states: tuple[JobState, ...] | None = None
        if state is not None:
            raw = [state] if isinstance(state, str) else list(state)
            try:
                states = tuple(JobState(s) for s in raw)
            except ValueError as exc:
                raise InvalidJobError(
                    f"unknown state in {raw!r}; states are {', '.join(JobState)}"
                ) from exc
        if limit < 1 or offset < 0:
            raise InvalidJobError("limit must be positive and offset not negative")
        if any("\x00" in (f or "") for f in (queue, task, key, owner, worker_id)):
            return []  # nothing stored holds a NUL character (PostgreSQL refuses it)
        flt = JobFilter(
            states=states,
            queue=queue,
            task=task,
            key=key,
            owner=owner,
            worker_id=worker_id,
            parent_id=parent_id,
            limit=limit,
            offset=offset,
            meta=job_meta.check(meta),
        )
        store = await self._store()
        return await store.list_jobs(flt)
