"""Hooks: an application's own code around enqueue, around each attempt, and on outcomes.

One shape covers the three moments. Subclass :class:`Hook`, override what you need, and
pass the hooks to the App (``tether.App(url, hooks=[...])``):

- :meth:`Hook.enqueue` runs around every enqueue (``enqueue``, ``enqueue_many``,
  workflows, ``ctx.spawn``). It may add entries to each job's ``meta``, or refuse the
  whole enqueue by raising :class:`~tether.errors.EnqueueRefused`.
- :meth:`Hook.execute` runs around every attempt's handler, in the worker, whatever its
  executor: it sees what the handler returns or raises, as a Sentry or tracing
  middleware would. A thread or async handler starts inside it, so context variables it
  sets (a current span) are the handler's too.
- :meth:`Hook.outcome` hears how jobs ended: ``succeeded``, ``failed`` (it will retry),
  ``exhausted`` (failed for good: no attempts left, or it raised ``Fail``),
  ``cancelled`` and ``rescued`` (its worker died or froze; the job's new state says what
  became of it).

The first hook given is the outermost. A hook's own failure never changes what happens
to a job: it is logged (logger ``tether.hooks``) and counted
(``tether_hook_errors_total``), and the job, its result or its error go on as if the
hook were not there. A hook that raises before calling ``call_next`` is skipped, one
that raises after it gets the answer it would have had, and an error it swallows stands.
Only ``EnqueueRefused`` (around enqueue) and ``Retry`` or ``Fail`` (around execution)
are a hook's own answer.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tether import metrics
from tether.errors import EnqueueRefused, Fail, Retry
from tether.job import Job, NewJob

if TYPE_CHECKING:
    from tether.context import JobContext

log = logging.getLogger("tether.hooks")

T = TypeVar("T")

#: How a job ended, as :meth:`Hook.outcome` hears it.
OutcomeKind = Literal["succeeded", "failed", "exhausted", "cancelled", "rescued"]


@dataclass
class Enqueueing:
    """One job as an enqueue hook sees it, before it is written. Only ``meta`` may be
    changed: add or replace entries (strings), within the same limits as at enqueue."""

    task: str
    queue: str
    args_json: str
    parent_id: int | None
    meta: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OutcomeEvent:
    """How one job ended. ``job`` is the job as its end left it (for ``rescued``: its
    state after the rescue). ``error`` is the attempt's error, ``reason`` the recorded
    reason (for ``cancelled``: the cancellation's), ``cancellation_id`` the record of a
    cancellation where one is known."""

    kind: OutcomeKind
    job: Job
    error: str | None = None
    reason: str | None = None
    cancellation_id: str | None = None


class Hook:
    """The base of every hook: each method does nothing until overridden."""

    async def enqueue(
        self, jobs: Sequence[Enqueueing], call_next: Callable[[], Awaitable[list[Job]]]
    ) -> list[Job]:
        """Around an enqueue of ``jobs`` (one transaction). Change their ``meta``, or
        raise :class:`~tether.errors.EnqueueRefused`, then return ``await call_next()``:
        the jobs as written."""
        return await call_next()

    async def execute(self, ctx: JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        """Around one attempt of ``ctx.job``: ``await call_next()`` runs the handler and
        returns its result or raises its error; return or raise it in turn."""
        return await call_next()

    async def outcome(self, event: OutcomeEvent) -> None:
        """A job ended as ``event`` says. Runs in the process that saw it end (the
        worker; the process that cancelled a job that was not running; the rescuer)."""


def _overrides(hook: Hook, name: str) -> bool:
    return getattr(type(hook), name) is not getattr(Hook, name)


def _failed(hook: Hook, phase: str, job_id: int | None = None) -> None:
    name = type(hook).__qualname__
    where = f" (job {job_id})" if job_id is not None else ""
    log.exception("hook %s failed in %s%s; the job goes on without it", name, phase, where)
    metrics.hook_failed(name, phase)


class Hooks:
    """An application's hooks, and the chains that run them."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        for hook in hooks:
            if not isinstance(hook, Hook):
                raise TypeError(f"{hook!r} is not a tether.Hook (subclass tether.Hook)")
        self.all = tuple(hooks)
        self._enqueue = tuple(h for h in self.all if _overrides(h, "enqueue"))
        self._execute = tuple(h for h in self.all if _overrides(h, "execute"))
        self._outcome = tuple(h for h in self.all if _overrides(h, "outcome"))

    @property
    def wraps_execution(self) -> bool:
        """Whether any hook runs around attempts (when none does, nothing is wrapped)."""
        return bool(self._execute)

    @property
    def hears_outcomes(self) -> bool:
        """Whether any hook listens to outcomes."""
        return bool(self._outcome)

    async def enqueue(
        self,
        new: list[NewJob],
        insert: Callable[[list[NewJob]], Awaitable[list[Job]]],
        validate: Callable[[NewJob], NewJob],
    ) -> list[Job]:
        """Write ``new`` with ``insert``, through every enqueue hook. ``validate``
        checks a job whose ``meta`` a hook changed (and may normalise it)."""
        if not self._enqueue:
            return await insert(new)
        views = [
            Enqueueing(n.task, n.queue, n.args_json, n.parent_id, dict(n.meta or {})) for n in new
        ]

        async def written() -> list[Job]:
            changed = [
                validate(dataclasses.replace(n, meta=v.meta or None))
                if dict(n.meta or {}) != v.meta
                else n
                for n, v in zip(new, views, strict=True)
            ]
            return await insert(changed)

        return await _chain(
            self._enqueue,
            lambda hook, call_next: hook.enqueue(views, call_next),
            written,
            "enqueue",
            passes=(EnqueueRefused,),
        )

    async def execute(self, ctx: JobContext, handler: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``handler`` through every execution hook."""
        return await _chain(
            self._execute,
            lambda hook, call_next: hook.execute(ctx, call_next),
            handler,
            "execute",
            job_id=ctx.job.id,
            passes=(Retry, Fail),
        )

    async def outcome(self, event: OutcomeEvent) -> None:
        """Tell every outcome hook; a failing one is logged and counted."""
        for hook in self._outcome:
            try:
                await hook.outcome(event)
            except Exception:
                _failed(hook, "outcome", event.job.id)


async def _chain(
    hooks: Sequence[Hook],
    call: Callable[[Hook, Callable[[], Awaitable[T]]], Awaitable[T]],
    innermost: Callable[[], Awaitable[T]],
    phase: str,
    *,
    job_id: int | None = None,
    passes: tuple[type[BaseException], ...] = (),
) -> T:
    """Run ``innermost`` inside ``hooks`` (the first outermost). What ``innermost``
    returns or raises is the answer; a hook's own exception is logged and counted, and
    the answer it would have had is given instead (a hook that raised before calling on
    is skipped). Exceptions in ``passes`` are a hook's deliberate answer, and stand."""
    if not hooks:
        return await innermost()
    hook, rest = hooks[0], hooks[1:]
    # What the inner chain did, so that a hook's failure can be told from the answer.
    inner: list[tuple[bool, Any]] = []

    async def call_next() -> T:
        if inner:
            raise RuntimeError(f"hook {type(hook).__qualname__} called call_next twice")
        try:
            value = await _chain(rest, call, innermost, phase, job_id=job_id, passes=passes)
        except BaseException as exc:
            inner.append((False, exc))
            raise
        inner.append((True, value))
        return value

    try:
        answer = await call(hook, call_next)
    except passes:
        raise
    except BaseException as exc:
        if inner and not inner[0][0] and inner[0][1] is exc:
            raise  # the inner chain's own exception, passed on
        if not isinstance(exc, Exception):
            raise  # cancellation and exits are not a hook's failure
        _failed(hook, phase, job_id)
        if not inner:
            return await call_next()
        ok, value = inner[0]
        if ok:
            return value  # type: ignore[no-any-return]
        raise value from None
    if inner and not inner[0][0] and isinstance(inner[0][1], Exception):
        # The hook swallowed the inner error: it stands all the same, or a job would
        # succeed without a result (or an enqueue seem done that wrote nothing).
        log.warning(
            "hook %s swallowed an error in %s (job %s); it stands",
            type(hook).__qualname__,
            phase,
            job_id,
        )
        metrics.hook_failed(type(hook).__qualname__, phase)
        raise inner[0][1]
    return answer


__all__ = ["Enqueueing", "Hook", "Hooks", "OutcomeEvent", "OutcomeKind"]
