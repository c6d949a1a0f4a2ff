"""Each check of an enqueue's input, and the job it builds: pure, before any store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tether import App, Schedule
from tether.errors import InvalidJobError, PayloadTooLargeError, UnknownTaskError
from tether.job import JSON, NewJob
from tether.new_job import declarations, new_job
from tether.task import EnqueueOptions, Task

LIMIT = 1000


@pytest.fixture
def tasks() -> dict[str, Task]:
    app = App("sqlite:///unused.db")
    app.resource("gpu", 2)

    @app.task(name="send", queue="mail", max_attempts=4, timeout=30.0, priority=2)
    async def send(ctx: object, to: str = "") -> None: ...

    @app.task(name="render", resources=["gpu"])
    async def render(ctx: object, size: int = 1) -> None: ...

    return app.tasks


def build(
    tasks: dict[str, Task],
    args: dict[str, JSON] | None = None,
    task: str = "send",
    **options: Any,
) -> NewJob:
    return new_job(tasks, task, args, EnqueueOptions(**options), max_payload_bytes=LIMIT)


def test_a_valid_job_takes_its_tasks_defaults(tasks: dict[str, Task]) -> None:
    job = build(tasks, {"to": "a@example.org"})
    assert (job.task, job.queue, job.priority, job.max_attempts, job.timeout) == (
        "send",
        "mail",
        2,
        4,
        30.0,
    )
    assert job.args_json == '{"to":"a@example.org"}'
    assert job.limits == ()
    assert job.idempotency_key is None


def test_options_override_the_task_and_name_its_limits(tasks: dict[str, Task]) -> None:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    job = build(
        tasks,
        task="render",
        queue="gpu-q",
        priority=9,
        key="tenant-1",
        max_attempts=1,
        timeout=5.0,
        owner="alice",
        idempotency_key="once",
        unique_for=60.0,
        budget=10,
        depends_on=[7],
        run_at=at,
    )
    assert (job.queue, job.priority, job.key, job.max_attempts, job.timeout) == (
        "gpu-q",
        9,
        "tenant-1",
        1,
        5.0,
    )
    assert job.limits == ("key:tenant-1", "resource:gpu")
    assert job.idempotency_key == "alice\x1fonce"  # scoped by its owner
    assert (job.unique_for, job.budget, job.depends_on, job.run_at) == (60.0, 10, (7,), at)


def test_no_args_are_an_empty_object(tasks: dict[str, Task]) -> None:
    assert build(tasks, None).args_json == "{}"


def test_an_unknown_task_is_refused_naming_the_known_ones(tasks: dict[str, Task]) -> None:
    with pytest.raises(UnknownTaskError, match=r"'nope' \(registered: render, send\)"):
        build(tasks, task="nope")
    with pytest.raises(UnknownTaskError, match="registered: none"):
        build({}, task="nope")


def test_args_must_be_an_object(tasks: dict[str, Task]) -> None:
    with pytest.raises(InvalidJobError, match="args must be a JSON object"):
        build(tasks, [1, 2])  # type: ignore[arg-type]


def test_args_must_fit_the_handler(tasks: dict[str, Task]) -> None:
    with pytest.raises(InvalidJobError):
        build(tasks, task="render", args={"size": "big"})


def test_args_must_be_storable(tasks: dict[str, Task]) -> None:
    with pytest.raises(InvalidJobError, match="cannot be stored"):
        build(tasks, {"to": "nul\x00"})


def test_args_over_the_limit_are_too_large(tasks: dict[str, Task]) -> None:
    with pytest.raises(PayloadTooLargeError, match=f"the limit is {LIMIT}"):
        build(tasks, {"to": "x" * LIMIT})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be at least 1"),
        ({"queue": "no spaces"}, "bad queue name"),
        ({"key": "a/b"}, "bad key name"),
        ({"idempotency_key": "a\x1fb"}, "must not hold"),
        ({"timeout": 0}, "timeout must be positive"),
        ({"delay": -1}, "delay must not be negative"),
        ({"delay": 5, "run_at": datetime(2030, 1, 1, tzinfo=UTC)}, "not both"),
        ({"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"unique_for": 60.0}, "needs an idempotency_key"),
        ({"unique_for": 0, "idempotency_key": "k"}, "unique_for must be positive"),
        ({"budget": 0}, "budget must be positive"),
    ],
)
def test_each_bad_option_is_refused(
    tasks: dict[str, Task], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidJobError, match=message):
        build(tasks, **options)


def test_declarations_carry_the_job_each_tick_makes(tasks: dict[str, Task]) -> None:
    nightly = Schedule("nightly", "send", "0 3 * * *", args={"to": "ops@example.org"})
    [made] = declarations(tasks, {"nightly": nightly}, max_payload_bytes=LIMIT)
    assert (made.name, made.task, made.cron, made.timezone) == (
        "nightly",
        "send",
        "0 3 * * *",
        "UTC",
    )
    assert Schedule.load("nightly", made.definition)[1].args_json == '{"to":"ops@example.org"}'
