"""One exception tree for tether.

Everything tether raises derives from :class:`TetherError`. Handlers use
:class:`Retry` and :class:`Fail` to steer what happens to the current attempt.
"""

from __future__ import annotations


class TetherError(Exception):
    """Root of every error tether raises."""


class ConfigError(TetherError, ValueError):
    """A setting or database URL is invalid."""


class InvalidJobError(TetherError, ValueError):
    """Enqueue input is invalid: unknown task, args that are not JSON, oversized payload."""


class UnknownTaskError(InvalidJobError, LookupError):
    """No task with this name is registered."""


class PayloadTooLargeError(InvalidJobError):
    """Encoded args (or a checkpoint, result) exceed the configured size limit."""


class EnqueueRefused(InvalidJobError):
    """An enqueue hook refused the enqueue; nothing was written."""


class JobNotFoundError(TetherError, LookupError):
    """No job has this id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


class IllegalTransitionError(TetherError):
    """The requested change is not legal from the job's current state."""

    def __init__(self, job_id: int, state: str, action: str) -> None:
        super().__init__(f"cannot {action} job {job_id}: it is {state}")
        self.job_id = job_id
        self.state = state
        self.action = action


class LeaseLostError(TetherError):
    """The worker no longer holds this job's lease; its write was not recorded."""


class StoreError(TetherError):
    """The database failed or is unreachable."""


class RowLocked(StoreError):
    """A row another session holds stayed locked past the call's bound on lock waits
    (see :data:`tether.store.driver.LOCK_WAIT`); nothing was changed. Try again later."""


class SchemaVersionError(StoreError):
    """The database schema lacks migrations this code needs, and they were not applied."""


class WaitTimeoutError(TetherError, TimeoutError):
    """A bounded wait ended before the job reached the awaited state."""


class Cancelled(TetherError):
    """Raised by ``ctx.check_cancelled()`` when the job must stop.

    ``reason`` says why: ``cancel``, ``shutdown`` or ``lease_lost``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"job interrupted: {reason}")
        self.reason = reason


class Retry(TetherError):
    """Raised by a handler to ask for another attempt, optionally after ``delay`` seconds."""

    def __init__(self, message: str = "retry requested", delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class Fail(TetherError):
    """Raised by a handler to fail the job at once, with no further attempts."""


class WaitForChildren(TetherError):
    """Raised (or returned) by a handler to end its current phase.

    The job becomes ``blocked`` and holds no worker until every child it spawned has
    ended; then it runs again with ``ctx.phase == phase`` and can read
    ``await ctx.children()``.
    """

    def __init__(self, phase: str = "aggregate") -> None:
        if not phase:
            raise ValueError("a phase needs a name")
        super().__init__(f"waiting for children; next phase: {phase}")
        self.phase = phase


class DuplicateStepError(TetherError, ValueError):
    """A step name was used twice in one job (each step, sleep and wait needs its own)."""


class SignalConflictError(TetherError):
    """The job already has a signal of this name, with another payload."""


class SignalTimeoutError(TetherError, TimeoutError):
    """Raised in a handler by ``ctx.wait_for()`` when its signal did not come in time."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no signal {name!r} came before the wait's timeout")
        self.name = name


class ScheduleNotFoundError(TetherError, LookupError):
    """No periodic schedule has this name."""
