"""``app.durable``: what handlers' durable steps left, and the signals people send to
the jobs that wait for them (:mod:`tether.durable`)."""

from __future__ import annotations

from tether.audit import audited
from tether.durable import check_name
from tether.errors import InvalidJobError, PayloadTooLargeError
from tether.facades.base import Facade, job_target
from tether.job import JSON, StepInfo
from tether.payload import encode as encode_payload


class Durable(Facade):
    """Durable steps, sleeps and waits: read a job's steps, and signal a job."""

    async def steps(self, job_id: int) -> list[StepInfo]:
        """The job's durable steps, sleeps and waits, in the order they began."""
        await self._job(job_id)
        store = await self._store()
        return await store.steps(job_id)

    @audited("job.signal", job_target)
    async def signal(
        self,
        job_id: int,
        name: str,
        payload: JSON = None,
        *,
        actor: str | None = None,
    ) -> str:
        """Send the signal ``name`` with ``payload`` to a job (``ctx.wait_for(name)``).

        Returns ``woke`` (the job was parked waiting for it and runs now), ``kept`` (the
        job finds it when it waits) or ``duplicate`` (this signal was already sent, with
        the same payload). A finished job, or one whose wait for ``name`` timed out,
        raises :class:`IllegalTransitionError`; the same name with another payload,
        :class:`~tether.errors.SignalConflictError`. Nothing is stored then.
        """
        check_name(name, "signal")
        try:
            encoded = encode_payload(payload)
        except ValueError as exc:
            raise InvalidJobError(f"signal payload cannot be stored: {exc}") from exc
        limit = self.app.config.max_payload_bytes
        if len(encoded.encode()) > limit:
            raise PayloadTooLargeError(f"signal payload exceeds {limit} bytes")
        store = await self._store()
        return await store.signal(job_id, name, encoded, actor or self.app.actor)
