"""Creating and deleting jobs: enqueue, spawn and delete
(:class:`~tether.store.protocols.JobStore`, :class:`~tether.store.protocols.LeaseStore`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tether import hints as h
from tether.errors import JobNotFoundError, StoreError
from tether.job import Job, NewJob
from tether.store.base import check_dependencies
from tether.store.common.base import LeaseLost, SqlBase
from tether.store.driver import Tx


def _id(job: Job) -> int:
    return job.id


def _meta_json(job: NewJob) -> str | None:
    # No meta is NULL, not {}: a job without meta writes nothing more.
    return json.dumps(dict(job.meta), separators=(",", ":")) if job.meta else None


class EnqueueSql(SqlBase):
    """New jobs: a producer's batch (idempotency keys, dependencies), a running parent's
    children; and deleting one."""

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Job]:
        if not jobs:
            return []

        async def body(tx: Tx) -> list[Job]:
            out, made = await self._insert_jobs(tx, jobs, [], None)
            await tx.notify(h.ENQUEUED, {job.queue for job in made})
            return out

        return await self._transact(body)

    async def _insert_jobs(
        self, tx: Tx, jobs: Sequence[NewJob], ids: list[int], batch: str | None
    ) -> tuple[list[Job], list[Job]]:
        """Insert ``jobs`` in a few statements however many there are: the jobs in input
        order, and those of them that are new.

        ``ids``: the ids of the entries before ``jobs`` in the same enqueue, which
        ``depends_on_batch`` counts from (a SQLite bulk's earlier chunks), extended with
        these. ``batch``: the SQLite bulk being written, or None.
        """
        q = self.sql.enqueue
        start = len(ids)
        keys = sorted({j.idempotency_key for j in jobs if j.idempotency_key is not None})
        taken: dict[str, Job] = {}
        if keys:
            params = {"keys": keys, "batch": batch}
            if q.LOCK_KEYS is not None:
                await tx.run(q.LOCK_KEYS, params)
            if q.RELEASE_KEYS is not None:
                await tx.run(q.RELEASE_KEYS, params)
            rows = await tx.tuples(q.TAKEN_KEYS, params)
            pending = {r[0] for r in rows if r[1]}
            for j in jobs:
                if j.idempotency_key in pending:
                    raise StoreError(
                        f"idempotency key {j.idempotency_key!r} is being written by a bulk "
                        "enqueue still in progress; try again"
                    )
            taken = {r[0]: self._rows.job_from_tuple(r[2:]) for r in rows}
        # Each entry stands for a new row, or for the job its idempotency key names: a
        # known key answers first, whatever the rest of the entry says (its dependencies
        # are not checked again).
        first: dict[str, int] = {}
        fresh: list[int] = []
        for i, j in enumerate(jobs):
            k = j.idempotency_key
            if k is None or (k not in taken and k not in first):
                fresh.append(i)
                if k is not None:
                    first[k] = i
        # Ids are drawn first when an entry depends on another of these, so that its
        # dependencies are known before anything is written; otherwise the insert
        # assigns them.
        here: list[int | None] = [None] * len(jobs)
        drawn = any(b >= start for i in fresh for b in jobs[i].depends_on_batch)
        if drawn:
            new_ids = sorted(r[0] for r in await tx.tuples(q.NEW_IDS, {"n": len(fresh)}))
            for i, new_id in zip(fresh, new_ids, strict=True):
                here[i] = new_id
        for i, j in enumerate(jobs):
            k = j.idempotency_key
            if k is not None and k in taken:
                here[i] = taken[k].id
            elif k is not None and first[k] != i:
                here[i] = here[first[k]]

        def batch_id(b: int) -> int:
            found = ids[b] if b < start else here[b - start]
            assert found is not None
            return found

        deps = {
            i: sorted({*jobs[i].depends_on, *(batch_id(b) for b in jobs[i].depends_on_batch)})
            for i in fresh
        }
        mine = {n for i in fresh if (n := here[i]) is not None}
        outside = sorted({d for ds in deps.values() for d in ds} - mine)
        found: dict[int, str] = {}
        if outside:
            found = dict(await tx.tuples(q.DEPENDENCY_STATES, {"ids": outside, "batch": batch}))
        # A new job of this batch has not succeeded: its dependents start blocked.
        found.update(dict.fromkeys(mine, "queued"))
        for i in fresh:
            check_dependencies(deps[i], found)
        upstream = {d for ds in deps.values() for d in ds}
        rows = [
            self._job_row(
                here[i],
                jobs[i],
                "blocked" if any(found[d] != "succeeded" for d in deps[i]) else "queued",
                here[i] in upstream,
            )
            for i in fresh
        ]
        insert = q.INSERT_JOBS
        if q.INSERT_KEYLESS_JOBS is not None and all(
            jobs[i].idempotency_key is None for i in fresh
        ):
            insert = q.INSERT_KEYLESS_JOBS
        made = await tx.tuples(insert, {"batch": batch, **q.job_rows(rows)})
        # Each row: the key as stored (scoped by owner, as the entries have it), then
        # the job. A new job answers for its entry by key; those without a key are in
        # the entries' order, as ids follow the rows' order (drawn or not).
        by_key = {r[0]: self._rows.job_from_tuple(r[1:]) for r in made if r[0] is not None}
        plain = iter(
            sorted((self._rows.job_from_tuple(r[1:]) for r in made if r[0] is None), key=_id)
        )
        new = {}
        for i in fresh:
            k = jobs[i].idempotency_key
            job = next(plain) if k is None else by_key.get(k)
            if job is not None:
                new[i] = job
        missed = [k for i in fresh if i not in new and (k := jobs[i].idempotency_key)]
        if missed:
            # PostgreSQL: a job spawned meanwhile took the key (a spawn takes no key
            # lock) and the insert skipped the row; that job answers for the entry.
            rows = await tx.tuples(q.TAKEN_KEYS, {"keys": missed, "batch": batch})
            taken.update({r[0]: self._rows.job_from_tuple(r[2:]) for r in rows})
        pairs = [(new[i].id, d) for i in fresh if i in new for d in deps[i]]
        if pairs:
            await tx.run(q.INSERT_DEPENDENCIES, q.dependency_rows(pairs, outside))
        if outside and q.MARK_UPSTREAM is not None:
            await tx.run(q.MARK_UPSTREAM, {"ids": outside})
        out = []
        for i, j in enumerate(jobs):
            k = j.idempotency_key
            answer = new.get(i) if k is None else taken.get(k) or new.get(first.get(k, -1))
            if answer is None:
                raise StoreError(f"idempotency key {k!r} was taken meanwhile; try again")
            out.append(answer)
            ids.append(answer.id)
        return out, [new[i] for i in fresh if i in new]

    async def spawn(self, parent_id: int, lease_token: int, job: NewJob) -> Job | None:
        params = {
            "parent": parent_id,
            "token": lease_token,
            "task": job.task,
            "args": job.args_json,
            "queue": job.queue,
            "priority": job.priority,
            "key": job.key,
            "max_attempts": job.max_attempts,
            "timeout": job.timeout,
            "delay": float(job.delay),
            "idem": job.idempotency_key,
            "budget": job.budget,
            "limits": list(job.limits) or None,
            "meta": _meta_json(job),
        }

        async def body(tx: Tx) -> Job | None:
            row = await tx.one(self.sql.enqueue.SPAWN, params)
            if row is None:
                return None
            # The mark first, then the fence: two spawns of one parent at once would each
            # hold the fence's shared lock and wait for the other's to mark (a deadlock);
            # this way the second waits for the first's mark, or finds it made.
            await tx.run(self.sql.enqueue.MARK_PARENT, {"id": parent_id})
            if not await self._lease_held(tx, parent_id, lease_token, no_cancel=True):
                raise LeaseLost
            await tx.notify(h.ENQUEUED, [job.queue])
            return self._rows.job(row)

        try:
            return await self._transact_bounded(body)
        except LeaseLost:
            return None  # rolled back: the lease was lost while the INSERT waited

    async def delete(self, job_id: int, actor: str | None) -> tuple[Job, list[Job]]:
        q = self.sql.enqueue
        params = {"id": job_id, "actor": actor}

        async def body(tx: Tx) -> tuple[Job, list[Job]]:
            row = await tx.one(q.DELETING, params)
            if row is None:
                raise JobNotFoundError(job_id)
            # By id: an UPDATE's RETURNING follows no order (PostgreSQL's changes with
            # the plan), and callers show the list.
            children = sorted(
                (self._rows.job(r) for r in await tx.all(q.CANCEL_CHILDREN, params)),
                key=lambda c: c.id,
            )
            # Settle the job itself first, so counters and dependents see it end.
            for statement in q.SETTLE_DELETED:
                await tx.run(statement, params)
            await self._after_transitions(tx, [*(c.id for c in children), job_id])
            for statement in q.DELETE_JOB:
                await tx.run(statement, params)
            return self._rows.job(row), children

        return await self._transact_bounded(body)

    @staticmethod
    def _job_row(
        new_id: int | None, j: NewJob, state: str, has_dependents: bool
    ) -> tuple[Any, ...]:
        """One new job's values, in the order of the dialects' ``job_rows``."""
        return (
            new_id,
            j.task,
            j.args_json,
            j.queue,
            j.priority,
            j.key,
            state,
            j.max_attempts,
            j.timeout,
            j.delay,
            j.owner,
            j.idempotency_key,
            j.budget,
            json.dumps(j.limits) if j.limits else None,
            j.parent_id,
            has_dependents,
            j.run_at,
            j.unique_for,
            _meta_json(j),
        )
