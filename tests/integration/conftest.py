"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.helpers import fast_config
from tests.integration.control_support import StartWorker
from tether import App, Worker


@pytest.fixture
async def workers(app: App) -> AsyncIterator[StartWorker]:
    """``await workers(services=True, **fast_config overrides)`` starts a real worker for
    ``app``; every worker started is stopped at the end of the test."""
    started: list[Worker] = []

    async def start(*, services: bool = True, **overrides: Any) -> Worker:
        worker = Worker(app, fast_config(**overrides))
        await worker.start(services=services)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.stop()
