"""A hook that reports job failures to an error tracker, the way Sentry's SDK is used.

Run by passing it to the App: ``tether.App(url, hooks=[ErrorTracker()])``. Every attempt
runs inside an isolated scope tagged with the job, so whatever the handler reports (or
what escapes it) is filed under that job; a job that fails for good is reported once
more as an event of its own. The tracker's SDK is imported where it is used, so this
file imports without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import tether


class ErrorTracker(tether.Hook):
    """Report each failed attempt, tagged with its job, and each exhausted job."""

    async def execute(self, ctx: tether.JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        import sentry_sdk

        with sentry_sdk.isolation_scope() as scope:
            scope.set_tag("tether.task", ctx.job.task)
            scope.set_tag("tether.queue", ctx.job.queue)
            scope.set_context("tether.job", {"id": ctx.id, "attempt": ctx.attempt})
            try:
                return await call_next()
            except (tether.Cancelled, tether.Retry):
                raise  # a stop or a planned retry is not an error to report
            except Exception as exc:
                sentry_sdk.capture_exception(exc)
                raise

    async def outcome(self, event: tether.OutcomeEvent) -> None:
        if event.kind == "exhausted":
            import sentry_sdk

            last = (event.error or "no error recorded").strip().splitlines()[-1]
            sentry_sdk.capture_message(
                f"job {event.job.id} ({event.job.task}) failed for good: {last}",
                level="error",
            )
