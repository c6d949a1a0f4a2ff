"""A worker's side of a job: claims, heartbeats, checkpoints, outcomes and artifacts
(:class:`~tether.store.protocols.LeaseStore`, :class:`~tether.store.protocols.ArtifactStore`).

Every write of a running job is fenced by its lease token and its state: a worker that
lost its lease (rescued, cancelled, deleted) changes nothing. These are the hot paths:
rows come back as tuples, and a batch is one statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tether.job import (
    ArtifactInfo,
    Beat,
    ControlRequest,
    Finished,
    HeartbeatResult,
    Job,
    Outcome,
)
from tether.store.common.base import LeaseLost, SqlBase
from tether.store.driver import Tx


class LeasesSql(SqlBase):
    """The worker's calls on the jobs it holds."""

    async def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        lease_duration: float,
    ) -> list[Job]:
        params = {
            "queues": list(queues),
            "tasks": list(tasks),
            "limit": limit,
            "worker": worker_id,
            "lease": lease_duration,
        }
        # Rows become jobs on the event loop's thread, not SQLite's store thread: that
        # thread is what a drain waits on, and the loop has time to spare meanwhile.
        jobs = [self._rows.job_from_tuple(r) for r in await self._claim(params)]
        jobs.sort(key=lambda j: (-j.priority, j.run_at, j.id))
        return jobs

    async def _claim(self, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The claimed jobs' rows (:data:`~tether.store.rows.JOB_COLUMNS`).

        PostgreSQL's claim, limit admission included, is one statement (``CLAIM``, the
        function ``tether_claim_paced``). SQLite's store overrides this: it looks before
        taking the write lock and admits in Python under it (:mod:`tether.store.admission`
        says why the two differ).
        """

        async def body(tx: Tx) -> list[tuple[Any, ...]]:
            # Tuples, not dicts: a claim is the hottest read there is.
            return await tx.tuples(self.sql.leases.CLAIM, params)

        return await self._change(body)

    async def heartbeat(
        self,
        worker_id: str,
        beats: Sequence[Beat],
        lease_duration: float,
        holding: Sequence[int] | None = None,
        seq: int | None = None,
    ) -> HeartbeatResult:
        q = self.sql.leases
        params = {
            "beats": q.beats(beats),
            "ids": [b.job_id for b in beats],
            "holding": None
            if holding is None
            else sorted({b.job_id for b in beats} | set(holding)),
            "worker": worker_id,
            "lease": lease_duration,
            "seq": seq,
        }

        async def body(tx: Tx) -> list[tuple[Any, ...]]:
            # Rows of (kind, id, cancel, force, pause); see the PostgreSQL HEARTBEAT.
            rows = await tx.tuples(q.HEARTBEAT, params)
            if q.HEARTBEAT_WORKER is not None:  # PostgreSQL's HEARTBEAT does it too
                found = await tx.run(q.HEARTBEAT_WORKER, params)
                if not found:  # gone, or a newer beat already counted (an older one late)
                    found = -1 if await tx.one(q.WORKER_EXISTS, params) else 0
                kind = {1: "worker", -1: "worker held"}.get(found, "worker gone")
                rows.append((kind, None, 0, 0, 0))
            return rows

        rows = await self._change(body)
        jobs = [r for r in rows if r[0] in ("kept", "held")]
        held = frozenset(r[1] for r in jobs if r[0] == "held")
        worker = next((r[0] for r in rows if r[0].startswith("worker")), "worker gone")
        return HeartbeatResult(
            frozenset(r[1] for r in jobs),
            tuple(
                ControlRequest(r[1], bool(r[2]), bool(r[3]), pause=bool(r[4]))
                for r in jobs
                if r[2] or r[4]
            ),
            held=held,
            # No worker row (a row deleted by hand): the rescue judges its jobs by
            # their leases alone, which this beat extended unless one was held.
            counted=worker == "worker" or (worker == "worker gone" and not held),
        )

    async def save_checkpoint(self, job_id: int, lease_token: int, checkpoint_json: str) -> bool:
        params = {"checkpoint": checkpoint_json, "id": job_id, "token": lease_token}

        async def body(tx: Tx) -> bool:
            return await tx.run(self.sql.leases.SAVE_CHECKPOINT, params) == 1

        return await self._change(body)

    async def finish(self, worker_id: str, outcomes: Sequence[Outcome]) -> Finished:
        accepted = Finished()
        held: set[int] = set()
        # Batches of FINISH_BATCH outcomes, each its own statement (on PostgreSQL, small
        # enough for one NOTIFY payload of their ids), or all at once where it is None.
        size = self.sql.leases.FINISH_BATCH or len(outcomes) or 1
        for i in range(0, len(outcomes), size):
            done, skipped = await self._finish(worker_id, outcomes[i : i + size])
            accepted.update(done)
            held.update(skipped)
        accepted.held = frozenset(held)
        return accepted

    async def _finish(
        self, worker_id: str, outcomes: Sequence[Outcome]
    ) -> tuple[set[int], set[int]]:
        """The ids recorded, and those skipped because someone else held their row."""

        async def body(tx: Tx) -> tuple[set[int], set[int]]:
            return await self._finish_in(tx, worker_id, outcomes)

        return await self._change(body)

    async def _finish_in(
        self, tx: Tx, worker_id: str, outcomes: Sequence[Outcome]
    ) -> tuple[set[int], set[int]]:
        """:meth:`_finish`'s statement and its consequences, in ``tx``."""
        q = self.sql.leases
        params = {
            "outcomes": q.outcomes(outcomes),
            "ids": [o.job_id for o in outcomes],
            "worker": worker_id,
        }
        rows = await tx.tuples(q.FINISH, params)
        accepted = {r[0] for r in rows if r[1]}
        await self._after_transitions(tx, sorted(accepted))
        await self._after_finish(tx, outcomes)
        return accepted, {r[0] for r in rows if not r[1]}

    async def _after_finish(self, tx: Tx, outcomes: Sequence[Outcome]) -> None:
        """What a finish announces besides its transitions, in ``tx``: nothing here, as
        PostgreSQL's transition trigger notifies. SQLite's store overrides this."""

    async def save_artifact(self, job_id: int, lease_token: int, name: str, data: bytes) -> bool:
        params = {"id": job_id, "token": lease_token, "name": name, "size": len(data), "data": data}

        async def body(tx: Tx) -> bool:
            if await tx.run(self.sql.leases.SAVE_ARTIFACT, params) != 1:
                return False
            if not await self._lease_held(tx, job_id, lease_token, no_cancel=False):
                raise LeaseLost
            return True

        try:
            return await self._transact_bounded(body)
        except LeaseLost:
            return False  # rolled back: the lease was lost while the INSERT waited

    async def list_artifacts(self, job_id: int) -> list[ArtifactInfo]:
        async def body(tx: Tx) -> list[ArtifactInfo]:
            rows = await tx.all(self.sql.leases.LIST_ARTIFACTS, {"id": job_id})
            return [self._rows.artifact(r) for r in rows]

        return await self._query(body)

    async def get_artifact(self, job_id: int, name: str) -> bytes | None:
        async def body(tx: Tx) -> bytes | None:
            row = await tx.one(self.sql.leases.GET_ARTIFACT, {"id": job_id, "name": name})
            return bytes(row["data"]) if row else None

        return await self._query(body)
