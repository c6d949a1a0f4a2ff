"""Schedules and retention settings: validation, ticks across time zones, ages."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tether import App
from tether.config import RetentionConfig, parse_age
from tether.errors import ConfigError
from tether.periodic import Schedule


def test_a_tick_in_a_time_zone_follows_its_daylight_saving_time() -> None:
    s = Schedule("s", "t", "0 9 * * *", timezone="Europe/Paris")
    # 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer.
    assert s.next_tick(datetime(2026, 3, 27, 12, tzinfo=UTC)) == datetime(
        2026, 3, 28, 8, tzinfo=UTC
    )
    assert s.next_tick(datetime(2026, 3, 28, 12, tzinfo=UTC)) == datetime(
        2026, 3, 29, 7, tzinfo=UTC
    )


def test_due_names_the_latest_tick_and_how_many_passed() -> None:
    s = Schedule("s", "t", "*/5 * * * *")
    start = datetime(2026, 1, 1, 12, 1, tzinfo=UTC)
    assert s.due(start, datetime(2026, 1, 1, 12, 4, tzinfo=UTC)) == (None, 0)
    assert s.due(start, datetime(2026, 1, 1, 12, 22, tzinfo=UTC)) == (
        datetime(2026, 1, 1, 12, 20, tzinfo=UTC),
        4,
    )
    # Years of every-minute ticks are not walked one by one.
    latest, count = s.due(datetime(2020, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 3, tzinfo=UTC))
    assert latest == datetime(2026, 1, 1, tzinfo=UTC) and count >= 10_000


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"cron": "61 * * * *"}, "bad cron"),
        ({"timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"jitter": -1.0}, "must not be negative"),
        ({"missed": "all"}, "missed must be"),
    ],
)
def test_a_bad_schedule_is_a_clear_error(fields: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"cron": "* * * * *", **fields}
    with pytest.raises(ConfigError, match=needle):
        Schedule("s", "t", **args)  # type: ignore[arg-type]


def test_scheduling_refuses_unknown_tasks_duplicate_names_and_bad_args() -> None:
    app = App("sqlite:///unused.db")

    @app.periodic(cron="* * * * *", name="every-minute")
    async def beat(ctx: object, v: float = 0.0) -> None: ...

    assert app.schedules["every-minute"].task == beat.name
    with pytest.raises(ConfigError, match="unknown task"):
        app.schedule("nope", cron="* * * * *")
    with pytest.raises(ConfigError, match="already exists"):
        app.schedule(beat, cron="* * * * *", name="every-minute")
    with pytest.raises(Exception, match="cannot be stored"):
        app.schedule(beat, cron="* * * * *", name="x", args={"v": float("nan")})


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("15m", 900), ("12h", 43200), ("7d", 604800), ("2", 2)]
)
def test_ages_read_with_their_unit(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "7x", "-1d", "d", "inf"])
def test_a_bad_age_is_a_clear_error(text: str) -> None:
    with pytest.raises(ConfigError, match="bad age"):
        parse_age(text)


def test_retention_defaults_and_refusals() -> None:
    r = RetentionConfig()
    assert r.job_ages() == {"succeeded": 86400, "failed": 604800, "cancelled": 604800}
    assert RetentionConfig(failed=None).job_ages().keys() == {"succeeded", "cancelled"}
    with pytest.raises(ConfigError):
        RetentionConfig(succeeded=-1)
    with pytest.raises(ConfigError):
        RetentionConfig(batch_size=0)
