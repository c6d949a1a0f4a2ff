"""Background services back off while failing and keep their logs bounded."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tether.config import LoopBackoff
from tether.service import Service


class Flaky(Service):
    name = "flaky"

    def __init__(self, fail_times: int) -> None:
        super().__init__(0.001, backoff=LoopBackoff(2, 0.004), log_every=3600)
        self.fail_times = fail_times
        self.calls = 0

    async def run_once(self) -> None:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise ConnectionError("database down")
        if self.calls >= self.fail_times + 2:
            self.stop()


def test_delay_backs_off_exponentially_after_the_threshold() -> None:
    svc = Service(1.0, backoff=LoopBackoff(after_errors=2, ceiling=30))
    delays = []
    for errors in range(7):
        svc.errors = errors
        delays.append(svc.delay())
    assert delays == [1.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]


async def test_a_long_outage_logs_two_lines_not_one_per_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    svc = Flaky(fail_times=50)
    with caplog.at_level(logging.INFO, logger="tether.flaky"):
        await asyncio.wait_for(svc.run(), 10)
    assert svc.calls == 52
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "failed (1 in a row" in messages[0]
    assert "recovered after 50 failed rounds" in messages[1]
    assert svc.errors == 0
