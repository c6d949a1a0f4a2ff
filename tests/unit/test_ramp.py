"""The gradual start: first job at once, a warm phase, then the backlog spread out."""

from __future__ import annotations

from tests.helpers import fast_config
from tether.worker import Ramp


def ramp(backlog: int, window: float = 100.0) -> Ramp:
    return Ramp(fast_config(ramp_window=window, ramp_warm_jobs=10, ramp_warm_interval=1.0), backlog)


def test_first_job_at_once_then_one_per_interval_up_to_the_warm_jobs() -> None:
    r = ramp(backlog=110)
    assert [r.allowed(t) for t in (0, 0.5, 1, 2.5, 8.9, 9)] == [1, 1, 2, 3, 9, 10]


def test_the_rest_of_the_backlog_is_spread_evenly_over_the_window() -> None:
    r = ramp(backlog=110, window=100)
    assert r.allowed(9 + 50) == 10 + 50
    assert r.allowed(9 + 99) == 10 + 99


def test_after_the_window_there_is_no_limit() -> None:
    r = ramp(backlog=110, window=100)
    assert r.allowed(9 + 100) is None


def test_a_zero_window_turns_the_ramp_off() -> None:
    assert ramp(backlog=1000, window=0).allowed(0) is None


def test_next_step_points_at_the_next_allowance() -> None:
    r = ramp(backlog=110, window=100)
    assert r.next_step(0.25) == 0.75
    assert r.next_step(20) == 1.0
