"""Durable steps, sleeps, waits and signals."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tether.job import StepInfo, WaitResult


@runtime_checkable
class StepStore(Protocol):
    """What a job's attempts completed (its durable steps), the sleeps and waits that
    park it, and the signals people send it. Every write a worker makes is fenced by
    the job's lease token."""

    async def steps(self, job_id: int) -> list[StepInfo]:
        """The job's steps, sleeps and waits, in the order they began."""

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
        """Record a finished step's result, fenced; ``False`` means the lease is lost.

        ``took``: the step's duration in seconds; ``usage``: what it counted against
        the budget. A step already recorded raises
        :class:`~tether.errors.DuplicateStepError`."""

    async def fence(self, job_id: int, lease_token: int) -> bool:
        """Whether the job still runs under ``lease_token``; in a caller's transaction
        (a store from :func:`tether.store.caller_store`), the lease cannot change until
        that transaction ends."""

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
        usage: int | None = None,
    ) -> WaitResult:
        """Sleep (``signal`` ``None``) or wait for ``signal``, under the step ``name``.

        In one transaction under the job's row lock: a wait whose signal is in records
        it and returns ``done`` with its payload; a sleep or wait past its time returns
        ``done`` or ``timed_out``; anything else records the step as waiting (for
        ``seconds`` from now the first time, ``None``: no limit) and parks the job, back
        to ``queued`` until then with its attempt unspent (``parked``). A pending cancel
        or pause applies as at any release. ``lost``: the lease is gone. ``usage``: the
        job's usage so far, written when it parks (as an outcome carries it)."""

    async def signal(
        self, job_id: int, name: str, payload_json: str | None, actor: str | None = None
    ) -> str:
        """Send the signal ``name`` to a job: ``woke`` (a wait for it was parked and
        runs now), ``kept`` (the job finds it when it waits) or ``duplicate`` (the same
        signal was sent before). A finished job, or one whose wait for ``name`` timed
        out, raises :class:`~tether.errors.IllegalTransitionError`; another payload
        under a name already sent, :class:`~tether.errors.SignalConflictError`."""
