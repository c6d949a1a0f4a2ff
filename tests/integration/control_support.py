"""Helpers for the control-plane integration tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from tether import CancellationResult, Worker

StartWorker = Callable[..., Awaitable[Worker]]
"""The ``workers`` fixture: ``await workers(services=True, **fast_config overrides)``."""


def assert_one_runner(result: CancellationResult, worker: Worker | str, how: str) -> None:
    """The cancellation stopped exactly one runner, on ``worker`` (or that worker id), by
    ``how``."""
    worker_id = worker if isinstance(worker, str) else worker.id
    (runner,) = result.runners_terminated
    assert worker_id in runner and runner.endswith(f"({how})"), runner


def artifact_names(preserved: Sequence[str]) -> list[str]:
    """Artifact names from a cancellation's ``artifacts_preserved`` (``job/name``)."""
    return [entry.rsplit("/", 1)[-1] for entry in preserved]
