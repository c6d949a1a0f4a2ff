"""Schedules and retention settings: validation, ticks across time zones, ages."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tether import App
from tether.config import RetentionConfig, parse_age
from tether.errors import ConfigError
from tether.job import NewJob
from tether.periodic import Due, Schedule


def test_a_tick_in_a_time_zone_follows_its_daylight_saving_time() -> None:
    s = Schedule("s", "t", "0 9 * * *", timezone="Europe/Paris")
    # 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer.
    assert s.next_tick(datetime(2026, 3, 27, 12, tzinfo=UTC)) == datetime(
        2026, 3, 28, 8, tzinfo=UTC
    )
    assert s.next_tick(datetime(2026, 3, 28, 12, tzinfo=UTC)) == datetime(
        2026, 3, 29, 7, tzinfo=UTC
    )


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)  # type: ignore[misc]


def test_due_enqueues_every_tick_within_grace_and_skips_older_ones() -> None:
    s = Schedule("s", "t", "*/5 * * * *", grace=600)
    start = utc(2026, 1, 1, 12, 1)
    assert s.due(start, utc(2026, 1, 1, 12, 4)) == Due([], 0, None, False)
    # 12:05 to 12:20 passed; those up to 10 minutes late run, the older ones do not.
    due = s.due(start, utc(2026, 1, 1, 12, 22))
    assert due == Due([utc(2026, 1, 1, 12, 15), utc(2026, 1, 1, 12, 20)], 2, due.last, False)
    assert due.last == utc(2026, 1, 1, 12, 20)
    # "latest" runs the latest tick even beyond grace, once, when none is within it.
    late = Schedule("s", "t", "*/5 * * * *", missed="latest")
    assert late.due(start, utc(2026, 1, 1, 12, 22)) == Due(
        [utc(2026, 1, 1, 12, 20)], 3, utc(2026, 1, 1, 12, 20), False
    )


def test_due_per_second_ticks_are_all_enqueued_and_bounded_per_round() -> None:
    s = Schedule("s", "t", "* * * * * *")
    start = utc(2026, 1, 1, 12, 0, 0)
    # A 4-second leader handover: four ticks, each enqueued.
    due = s.due(start, utc(2026, 1, 1, 12, 0, 4))
    assert due.fire == [utc(2026, 1, 1, 12, 0, n) for n in range(1, 5)] and due.skipped == 0
    # A round enqueues at most `limit`; the rest are for the next round.
    capped = s.due(start, utc(2026, 1, 1, 12, 0, 30), limit=10)
    assert len(capped.fire) == 10 and capped.more and capped.last == utc(2026, 1, 1, 12, 0, 10)
    # After an hour's outage only the last grace (60 s) of ticks run: the others count.
    outage = s.due(start, utc(2026, 1, 1, 13, 0, 0))
    assert len(outage.fire) == 61 and outage.skipped == 3600 - 61
    assert outage.fire[0] == utc(2026, 1, 1, 12, 59, 0) and outage.last == utc(2026, 1, 1, 13)


def test_due_does_not_walk_years_of_ticks_one_by_one() -> None:
    s = Schedule("s", "t", "* * * * *", missed="latest")
    due = s.due(utc(2020, 1, 1), utc(2026, 1, 1, 0, 3, 30))
    assert due.skipped >= 10_000
    assert due.fire == [utc(2026, 1, 1, 0, 3)] and due.last == utc(2026, 1, 1, 0, 3)
    gone = Schedule("s", "t", "* * * * *").due(utc(2020, 1, 1), utc(2026, 1, 1, 0, 3, 30))
    assert gone.fire == [utc(2026, 1, 1, 0, 3)] and gone.skipped >= 10_000


def test_a_stored_definition_gives_back_the_schedule_and_its_job() -> None:
    s = Schedule("s", "t", "0 9 * * *", timezone="Europe/Paris", args={"n": 1}, jitter=5)
    job = NewJob(task="t", args_json='{"n":1}', queue="q", priority=3, limits=("resource:x",))
    again, template = Schedule.load("s", s.stored(job))
    assert again == s and template == job
    tick = utc(2026, 1, 1, 8)
    made = again.job(template, tick)
    assert made.idempotency_key == "schedule:s:2026-01-01T08:00:00+00:00"
    assert 0 <= made.delay <= 5 and made.queue == "q" and made.limits == ("resource:x",)
    with pytest.raises(ConfigError, match="unreadable"):
        Schedule.load("s", '{"cron": "* * * * *"}')


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

    assert app.schedules.declared["every-minute"].task == beat.name
    with pytest.raises(ConfigError, match="unknown task"):
        app.schedules.declare("nope", cron="* * * * *")
    with pytest.raises(ConfigError, match="already exists"):
        app.schedules.declare(beat, cron="* * * * *", name="every-minute")
    with pytest.raises(Exception, match="cannot be stored"):
        app.schedules.declare(beat, cron="* * * * *", name="x", args={"v": float("nan")})


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
