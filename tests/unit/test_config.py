"""Settings are validated once, with clear errors."""

from __future__ import annotations

import pytest

from tether import ConfigError, RetryPolicy, WorkerConfig
from tether.config import LoopBackoff


def test_default_worker_settings_recover_a_killed_job_within_15_seconds() -> None:
    cfg = WorkerConfig()
    # Worst case without fast detection: the lease runs out, then the rescuer's next round.
    assert cfg.lease_duration + cfg.rescue_interval <= 15


def test_a_lost_session_presumes_a_worker_dead_only_once_it_fenced_itself() -> None:
    assert WorkerConfig().session_dead_after == 9.0  # 10 s lease - 2 s margin / 2 > 6 s grace
    cfg = WorkerConfig(
        lease_duration=3.0, heartbeat_interval=0.5, self_fence_margin=0.75, dead_session_grace=2.5
    )
    assert cfg.session_dead_after == 2.625  # it fences itself at 2.25 s


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": 0},
        {"claim_batch": 0},
        {"queues": ()},
        {"heartbeat_interval": 0},
        {"lease_duration": 3, "heartbeat_interval": 2},
        {"stop_timeout": -1},
        {"cancel_grace": -1},
    ],
)
def test_invalid_worker_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        WorkerConfig(**bad)  # type: ignore[arg-type]


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    policy = RetryPolicy(base_delay=1, factor=2, max_delay=10, jitter=0)
    assert [policy.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_jitter_spreads_delays_within_bounds() -> None:
    policy = RetryPolicy(base_delay=10, factor=1, jitter=0.2)
    delays = {round(policy.delay(1), 6) for _ in range(200)}
    assert len(delays) > 1
    assert all(8 <= d <= 12 for d in delays)


@pytest.mark.parametrize("bad", [{"base_delay": -1}, {"factor": 0.5}, {"jitter": 1.5}])
def test_invalid_retry_policies_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**bad)


@pytest.mark.parametrize("bad", [{"after_errors": -1}, {"ceiling": 0}])
def test_invalid_loop_backoff_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        LoopBackoff(**bad)  # type: ignore[arg-type]


def test_loop_backoff_doubles_the_interval_past_the_threshold_up_to_its_ceiling() -> None:
    backoff = LoopBackoff(after_errors=1, ceiling=4.0)
    assert [backoff.delay(1.0, n) for n in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]
