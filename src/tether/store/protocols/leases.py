"""Leases: what workers claim, extend and write under a lease token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tether.job import Beat, Finished, HeartbeatResult, Job, NewJob, Outcome


@runtime_checkable
class LeaseStore(Protocol):
    """A running job's lease, as workers hold it: claim jobs, extend their leases, and
    write what an attempt produces (checkpoints, artifacts, children, its outcome).
    Every write is fenced by the lease token, so a worker that lost the lease
    changes nothing."""

    async def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        lease_duration: float,
    ) -> list[Job]:
        """Lease up to ``limit`` claimable jobs, bumping each lease token.

        A job whose queue or task has a rate limit is taken only while that limit's
        bucket holds a token, and taking it spends one, in the same transaction."""

    async def heartbeat(
        self,
        worker_id: str,
        beats: Sequence[Beat],
        lease_duration: float,
        holding: Sequence[int] | None = None,
        seq: int | None = None,
    ) -> HeartbeatResult:
        """One write: extend these leases, flush progress, count a beat on the worker
        row. Never waits on another client's row lock: a row held elsewhere is skipped
        (see :class:`~tether.job.HeartbeatResult`). ``holding``: every job the worker
        still holds (these, and those being finished or stopped), recorded with the
        beat; a running job of the worker that is not in it and older than the beat
        before was dropped by it, and the rescue judges it by its lease. ``None``: not
        known (a claim is out), and nothing is judged dropped. ``seq``: the worker's
        own number for this beat, increasing; a beat that lands after one with a higher
        number (a call the worker gave up on, delivered late) is not counted and leaves
        the worker's row alone. ``None``: no order is checked.

        Returns the leases still held and their pending control requests.
        """

    async def save_checkpoint(self, job_id: int, lease_token: int, checkpoint_json: str) -> bool:
        """Fenced write of a checkpoint; ``False`` means the lease is lost."""

    async def save_artifact(self, job_id: int, lease_token: int, name: str, data: bytes) -> bool:
        """Fenced write of an artifact; ``False`` means the lease is lost."""

    async def spawn(self, parent_id: int, lease_token: int, job: NewJob) -> Job | None:
        """Create a child of a running parent, fenced by its lease (``None``: refused)."""

    async def finish(self, worker_id: str, outcomes: Sequence[Outcome]) -> Finished:
        """Record how attempts ended, fenced. Returns the ids whose write was accepted;
        its ``held`` names those skipped because someone else held their row (still
        ours: try them again later). Never waits on another client's row lock."""
