"""The error-tracker hook of examples/error_tracker.py (shown in the observability
guide), against a stand-in for the tracker's SDK, on both stores with a real worker."""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from examples.error_tracker import ErrorTracker

import tether
from tests.helpers import eventually
from tests.integration.control_support import StartWorker
from tether import App, JobState
from tether.hooks import Hooks

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "observability.md"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "error_tracker.py"


class Tracker:
    """What a Sentry-like SDK was asked to do."""

    def __init__(self) -> None:
        self.exceptions: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.messages: list[str] = []
        # Per task, as the real SDK keeps its scopes.
        self._scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
            "scope", default=None
        )

    def module(self) -> types.ModuleType:
        sdk = types.ModuleType("sentry_sdk")

        @contextlib.contextmanager
        def isolation_scope() -> Iterator[Scope]:
            token = self._scope.set(Scope())
            try:
                yield self._scope.get()  # type: ignore[misc]
            finally:
                self._scope.reset(token)

        def capture_exception(exc: BaseException) -> None:
            scope = self._scope.get() or Scope()
            self.exceptions.append((str(exc), dict(scope.tags), dict(scope.contexts)))

        def capture_message(message: str, level: str = "info") -> None:
            self.messages.append(f"{level}: {message}")

        sdk.isolation_scope = isolation_scope  # type: ignore[attr-defined]
        sdk.capture_exception = capture_exception  # type: ignore[attr-defined]
        sdk.capture_message = capture_message  # type: ignore[attr-defined]
        return sdk


class Scope:
    def __init__(self) -> None:
        self.tags: dict[str, str] = {}
        self.contexts: dict[str, Any] = {}

    def set_tag(self, key: str, value: str) -> None:
        self.tags[key] = value

    def set_context(self, key: str, value: Any) -> None:
        self.contexts[key] = value


@pytest.fixture
def tracker(monkeypatch: pytest.MonkeyPatch) -> Tracker:
    made = Tracker()
    monkeypatch.setitem(sys.modules, "sentry_sdk", made.module())
    return made


async def test_failed_attempts_are_reported_with_their_job_and_exhaustion_once(
    app: App, workers: StartWorker, tracker: Tracker
) -> None:
    app.hooks = Hooks([ErrorTracker()])

    @app.task(name="charge", max_attempts=2, retry=tether.RetryPolicy(base_delay=0.01))
    async def charge(ctx: tether.JobContext) -> None:
        raise RuntimeError(f"card declined (attempt {ctx.attempt})")

    @app.task(name="poll", max_attempts=2)
    async def poll(ctx: tether.JobContext) -> str:
        if ctx.attempt == 1:
            raise tether.Retry("not ready yet", delay=0.01)
        return "ready"

    failing = await charge.enqueue()
    planned = await poll.enqueue()
    await workers()
    assert (await app.wait(failing.id, timeout=15)).state is JobState.FAILED
    assert (await app.wait(planned.id, timeout=15)).state is JobState.SUCCEEDED
    assert [e[0] for e in tracker.exceptions] == [
        "card declined (attempt 1)",
        "card declined (attempt 2)",
    ], "a planned Retry is not reported"
    _, tags, contexts = tracker.exceptions[1]
    assert tags == {"tether.task": "charge", "tether.queue": "default"}
    assert contexts == {"tether.job": {"id": failing.id, "attempt": 2}}

    async def reported() -> bool:
        return bool(tracker.messages)

    await eventually(reported)
    assert tracker.messages == [
        f"error: job {failing.id} (charge) failed for good: RuntimeError: card declined (attempt 2)"
    ]


def test_the_guide_shows_the_example_as_it_is() -> None:
    guide = GUIDE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    hook = EXAMPLE.read_text().split("import tether\n", 1)[1].strip()
    assert any(hook in block for block in blocks), "the guide's error-tracker hook drifted"
