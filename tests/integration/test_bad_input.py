"""Bad input gets a clear error and changes nothing."""

from __future__ import annotations

import pytest

import tether
from tether import App, AppConfig, JobState


@pytest.fixture
def echo_app(app: App) -> App:
    @app.task(name="echo")
    async def echo(ctx: tether.JobContext, **kwargs: object) -> None:
        return None

    return app


async def _nothing_written(app: App) -> None:
    assert sum((await app.jobs.stats()).values()) == 0


async def test_unknown_task_is_refused(echo_app: App) -> None:
    with pytest.raises(tether.UnknownTaskError, match=r"unknown task 'nope'.*registered: echo"):
        await echo_app.enqueue("nope", {})
    await _nothing_written(echo_app)


@pytest.mark.parametrize(
    "args",
    [{"x": object()}, {"x": float("nan")}, {"x": {1, 2}}, ["not", "a", "dict"]],
    ids=["object", "nan", "set", "list"],
)
async def test_args_that_are_not_a_json_object_are_refused(echo_app: App, args: object) -> None:
    with pytest.raises(tether.InvalidJobError):
        await echo_app.enqueue("echo", args)  # type: ignore[arg-type]
    await _nothing_written(echo_app)


async def test_oversized_args_are_refused(db_url: str) -> None:
    app = App(db_url, config=AppConfig(max_payload_bytes=1000))

    @app.task(name="echo")
    async def echo(ctx: tether.JobContext, blob: str) -> None:
        return None

    try:
        with pytest.raises(tether.PayloadTooLargeError, match="limit is 1000"):
            await app.enqueue("echo", {"blob": "x" * 1000})
        await _nothing_written(app)
        assert (await app.enqueue("echo", {"blob": "x" * 900})).state is JobState.QUEUED
    finally:
        await app.close()


async def test_default_payload_limit_is_one_mebibyte(echo_app: App) -> None:
    with pytest.raises(tether.PayloadTooLargeError):
        await echo_app.enqueue("echo", {"blob": "x" * (1024 * 1024)})
    await _nothing_written(echo_app)


async def test_one_bad_job_in_a_bulk_enqueue_writes_none(echo_app: App) -> None:
    with pytest.raises(tether.InvalidJobError):
        await echo_app.enqueue_many([("echo", {"ok": 1}), ("echo", {"bad": object()})])
    await _nothing_written(echo_app)


async def test_unknown_job_id_is_a_clear_error(echo_app: App) -> None:
    with pytest.raises(tether.JobNotFoundError, match="job 424242 does not exist"):
        await echo_app.get(424242)
    with pytest.raises(tether.JobNotFoundError):
        await echo_app.cancel(424242)
    with pytest.raises(tether.JobNotFoundError):
        await echo_app.wait(424242, timeout=1)
    with pytest.raises(tether.JobNotFoundError):
        await echo_app.jobs.events(424242)


async def test_cancelling_twice_is_not_an_error(echo_app: App) -> None:
    job = await echo_app.enqueue("echo", {})
    first = await echo_app.cancel(job.id, reason="first")
    second = await echo_app.cancel(job.id, reason="second")
    assert (first.outcome, second.outcome) == ("cancelled", "already_cancelled")
    assert second.cancellation_id == first.cancellation_id, "one record, not two"
    assert second.job.cancel_reason == "first"


@pytest.mark.parametrize(
    "url",
    ["", "mysql://localhost/db", "sqlite://", "sqlite:///", "sqlite:///:memory:", "nonsense"],
)
def test_malformed_database_url_is_refused(url: str) -> None:
    with pytest.raises(tether.ConfigError):
        App(url or " ")


async def test_invalid_enqueue_options_are_refused(echo_app: App) -> None:
    with pytest.raises(tether.InvalidJobError):
        await echo_app.enqueue("echo", {}, max_attempts=0)
    with pytest.raises(tether.InvalidJobError):
        await echo_app.enqueue("echo", {}, delay=-1)
    with pytest.raises(tether.InvalidJobError):
        await echo_app.enqueue("echo", {}, timeout=0)
    with pytest.raises(tether.InvalidJobError):
        await echo_app.jobs.list(state="bogus")
    await _nothing_written(echo_app)


async def test_idempotency_key_returns_the_same_job(echo_app: App) -> None:
    first = await echo_app.enqueue("echo", {"n": 1}, idempotency_key="order-7")
    again = await echo_app.enqueue("echo", {"n": 2}, idempotency_key="order-7")
    assert again.id == first.id
    assert again.args == {"n": 1}
    assert (await echo_app.jobs.stats())["queued"] == 1


def test_sync_callers_can_enqueue_and_read(db_url: str) -> None:
    app = App(db_url)

    @app.task(name="echo")
    async def echo(ctx: tether.JobContext) -> None:
        return None

    job = echo.enqueue_sync()
    assert app.get_sync(job.id).state is JobState.QUEUED
    assert app.cancel_sync(job.id).outcome == "cancelled"
    app.run_sync(app.close())


def test_task_registration_errors_are_clear() -> None:
    app = App("sqlite:///unused.db")

    @app.task(name="dup")
    async def one(ctx: tether.JobContext) -> None:
        return None

    with pytest.raises(tether.ConfigError, match="already registered"):

        @app.task(name="dup")
        async def two(ctx: tether.JobContext) -> None:
            return None

    with pytest.raises(tether.ConfigError, match="max_attempts"):
        app.task(name="bad", max_attempts=0)(one.fn)
