"""Durable steps, sleeps and signals (:class:`~tether.store.protocols.StepStore`).

A step's row is written under its job's lease, like a checkpoint: a worker that lost
the lease (rescued, cancelled, deleted) writes nothing, so a zombie's step never
counts, and the attempt that holds the lease reads every step an earlier one finished.

A sleep or a wait for a signal parks the job: in one transaction, under the job's row
lock, it records the wait and releases the job to ``queued`` with ``run_at`` at the
wake-up time, its attempt unspent. A signal takes the same row lock before it is
stored, so a signal is either seen by the wait (which then does not park) or comes
after the job is parked and moves its ``run_at`` to now: no wake-up is lost.
"""

from __future__ import annotations

from typing import Any

from tether import hints as h
from tether.errors import (
    DuplicateStepError,
    IllegalTransitionError,
    JobNotFoundError,
    SignalConflictError,
)
from tether.job import Outcome, StepInfo, WaitResult
from tether.states import TERMINAL, JobState
from tether.store.common.base import LeaseLost
from tether.store.common.leases import LeasesSql
from tether.store.driver import Tx

#: A wait with no timeout is parked this long (about a century); its signal wakes it.
FOREVER = 100 * 365.25 * 86400.0


def signal_step(name: str) -> str:
    """The step that records a wait for the signal ``name``."""
    return f"signal:{name}"


class StepsSql(LeasesSql):
    """A job's durable steps, its sleeps and waits, and the signals sent to it."""

    async def steps(self, job_id: int) -> list[StepInfo]:
        async def body(tx: Tx) -> list[StepInfo]:
            rows = await tx.all(self.sql.steps.STEPS, {"id": job_id})
            return [self._rows.step(r) for r in rows]

        return await self._query(body)

    async def save_step(
        self,
        job_id: int,
        lease_token: int,
        name: str,
        result_json: str,
        *,
        took: float = 0.0,
        usage: int = 0,
    ) -> bool:
        params = self._step_params(job_id, lease_token, name, "step", "done", result_json)
        params |= {"took": max(0.0, took), "usage": usage}

        async def body(tx: Tx) -> bool:
            return await self._save_step_in(tx, params)

        try:
            return await self._transact_bounded(body)
        except LeaseLost:
            return False  # rolled back: the lease was lost while the INSERT waited

    async def _save_step_in(self, tx: Tx, params: dict[str, Any]) -> bool:
        if await tx.run(self.sql.steps.SAVE_STEP, params) != 1:
            # No row: the lease is gone, or the step is already recorded. FENCE tells
            # them apart on both stores (_lease_held answers True on SQLite, where it
            # only follows a write that proved the lease).
            held = {"id": params["id"], "token": params["token"]}
            if await tx.one(self.sql.steps.FENCE, held) is None:
                return False
            raise DuplicateStepError(
                f"step {params['name']!r} of job {params['id']} is already recorded"
            )
        if not await self._lease_held(tx, params["id"], params["token"], no_cancel=False):
            raise LeaseLost
        return True

    async def fence(self, job_id: int, lease_token: int) -> bool:
        async def body(tx: Tx) -> bool:
            row = await tx.one(self.sql.steps.FENCE, {"id": job_id, "token": lease_token})
            return row is not None

        return await self._transact_bounded(body)

    @staticmethod
    def _step_params(
        job_id: int, token: int, name: str, kind: str, state: str, result_json: str | None
    ) -> dict[str, Any]:
        return {
            "id": job_id,
            "token": token,
            "name": name,
            "kind": kind,
            "state": state,
            "result": result_json,
            "wait": None,
            "took": 0.0,
            "usage": 0,
        }

    async def wait(
        self,
        worker_id: str,
        job_id: int,
        lease_token: int,
        name: str,
        *,
        signal: str | None = None,
        seconds: float | None = None,
        reason: str,
    ) -> WaitResult:
        q = self.sql.steps
        kind = "sleep" if signal is None else "signal"

        def step(state: str, result: str | None = None) -> dict[str, Any]:
            return self._step_params(job_id, lease_token, name, kind, state, result)

        async def body(tx: Tx) -> WaitResult:
            if await tx.one(q.LOCK_OWN_JOB, {"id": job_id, "token": lease_token}) is None:
                return WaitResult("lost")
            row = await tx.one(q.STEP, {"id": job_id, "name": name})
            if row is not None and row["state"] == "done":
                return WaitResult("done", self._rows.json_text(row["result"]))
            if row is not None and row["state"] == "timed_out":
                return WaitResult("timed_out")
            if signal is not None:
                sent = await tx.one(q.SIGNAL, {"id": job_id, "name": signal})
                if sent is not None:
                    encoded = self._rows.json_text(sent["payload"])
                    await tx.run(q.SAVE_STEP, step("done", encoded))
                    return WaitResult("done", encoded)
            if row is None:
                left = seconds
                if left is None or left > 0:
                    await tx.run(q.SAVE_STEP, step("waiting") | {"wait": left})
            else:
                left = None if row["left_s"] is None else float(row["left_s"])
            if left is not None and left <= 0:
                if signal is None:
                    await tx.run(q.SAVE_STEP, step("done"))
                    return WaitResult("done")
                await tx.run(q.SAVE_STEP, step("timed_out"))
                return WaitResult("timed_out")
            park = Outcome(
                job_id,
                lease_token,
                JobState.QUEUED,
                delay=FOREVER if left is None else left,
                reason=reason,
            )
            accepted, _ = await self._finish_in(tx, worker_id, [park])
            return WaitResult("parked" if accepted else "lost")

        return await self._transact_bounded(body)

    async def signal(
        self, job_id: int, name: str, payload_json: str | None, actor: str | None = None
    ) -> str:
        q = self.sql.steps
        params = {"id": job_id, "name": name, "payload": payload_json, "actor": actor}

        async def body(tx: Tx) -> str:
            row = await tx.one(q.LOCK_JOB, {"id": job_id})
            if row is None:
                raise JobNotFoundError(job_id)
            if JobState(row["state"]) in TERMINAL:
                raise IllegalTransitionError(job_id, row["state"], f"signal {name!r} to")
            wait = await tx.one(q.STEP, {"id": job_id, "name": signal_step(name)})
            if wait is not None and wait["state"] == "timed_out":
                raise IllegalTransitionError(
                    job_id, f"past its wait for {name!r}, which timed out", f"signal {name!r} to"
                )
            if await tx.run(q.SEND_SIGNAL, params) == 0:
                same = await tx.one(q.SAME_SIGNAL, params)
                if same is None or not same["same"]:
                    raise SignalConflictError(
                        f"job {job_id} already has a signal {name!r} with another payload"
                    )
                return "duplicate"
            woken = await tx.all(q.WAKE, {"id": job_id, "step": signal_step(name)})
            if woken:
                await tx.notify(h.ENQUEUED, [woken[0]["queue"]])
                return "woke"
            return "kept"

        return await self._transact_bounded(body)
