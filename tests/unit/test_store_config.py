"""The PostgreSQL store's settings: config, URL query parameters, ``--pool-size``; and the
throttle that keeps the pool's warnings to one line per interval."""

from __future__ import annotations

import logging
import os

import pytest
from typer.testing import CliRunner

from tether import App, AppConfig, ConfigError, StoreConfig
from tether.cli import cli, set_pool_size
from tether.store import create_store, postgres
from tether.store.postgres import (
    POOL_LOG_THROTTLE,
    LogThrottle,
    PostgresStore,
    session_name,
    split_url,
)


def test_url_parameters_win_over_the_config_and_never_reach_the_driver() -> None:
    dsn, settings = split_url(
        "postgresql://u@h:5432/db?sslmode=disable&pool_size=3&statement_timeout=60",
        StoreConfig(pool_size=20, answer_timeout=1.5),
    )
    assert dsn == "postgresql://u@h:5432/db?sslmode=disable"
    assert (settings.pool_size, settings.statement_timeout) == (3, 60.0)
    assert settings.answer_timeout == 1.5


def test_a_url_without_parameters_keeps_the_config() -> None:
    config = StoreConfig(pool_size=4)
    assert split_url("postgresql://h/db", config) == ("postgresql://h/db", config)


@pytest.mark.parametrize("query", ["pool_size=many", "pool_size=0", "answer_timeout=-1"])
def test_a_bad_url_parameter_is_a_clear_error(query: str) -> None:
    with pytest.raises(ConfigError):
        App(f"postgresql://h/db?{query}")


def test_pool_size_option_wins_over_the_url_and_the_config() -> None:
    app = App(
        "postgresql://h/db?pool_size=7&sslmode=disable",
        config=AppConfig(store=StoreConfig(pool_size=5)),
    )
    set_pool_size(app, 2)
    assert app.url == "postgresql://h/db?sslmode=disable"
    store = create_store(app.url, app.config.store)
    assert isinstance(store, PostgresStore)
    assert store.settings.pool_size == 2


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_worker_and_serve_take_a_pool_size(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "--pool-size" in result.output


def test_throttle_lets_one_warning_through_per_interval_and_counts_the_rest() -> None:
    logger = logging.getLogger("tests.throttle")
    logger.setLevel(logging.INFO)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    throttle = LogThrottle(every=3600)
    handler = Keep()
    logger.addFilter(throttle)
    logger.addHandler(handler)
    try:
        for i in range(5):
            logger.warning("connection failed %d", i)
        logger.info("not a warning")
        throttle.last = -1e9  # the interval has passed
        logger.warning("connection failed again")
    finally:
        logger.removeFilter(throttle)
        logger.removeHandler(handler)
    assert seen == [
        "connection failed 0",
        "not a warning",
        "connection failed again (4 more held back in the last 3600s)",
    ]


def test_the_pool_logger_is_throttled() -> None:
    assert POOL_LOG_THROTTLE in logging.getLogger("psycopg.pool").filters


def test_pgbouncer_and_listen_url_come_from_the_url() -> None:
    dsn, settings = split_url(
        "postgresql://u@pooler:6432/db?pgbouncer=true&sslmode=disable"
        "&listen_url=postgresql%3A%2F%2Fu%40db%3A5432%2Fdb%3Fsslmode%3Ddisable",
        StoreConfig(),
    )
    assert dsn == "postgresql://u@pooler:6432/db?sslmode=disable"
    assert settings.pgbouncer is True
    assert settings.listen_url == "postgresql://u@db:5432/db?sslmode=disable"


def test_a_bad_pgbouncer_value_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="pgbouncer"):
        App("postgresql://h/db?pgbouncer=maybe")


def test_a_worker_keeps_one_connection_grows_to_two_and_serve_takes_four_unless_told() -> None:
    store = create_store("postgresql://h/db")
    assert isinstance(store, PostgresStore)
    # One kept; a second only while calls overlap, closed again after 10 s unused.
    assert (store._pool.min_size, store._pool.max_size, store._pool.max_idle) == (1, 2, 10.0)
    app = App("postgresql://h/db")
    set_pool_size(app, None, default=4)  # what `tether serve` does
    assert app.config.store.pool_size == 4
    told = App("postgresql://h/db", config=AppConfig(store=StoreConfig(pool_size=3)))
    set_pool_size(told, None, default=4)
    assert told.config.store.pool_size == 3


def test_sessions_are_named_after_the_host_and_pid_with_the_pid_kept_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgres, "hostname", lambda: "box")
    assert session_name() == f"tether box:{os.getpid()}"
    monkeypatch.setattr(postgres, "hostname", lambda: "h" * 100)
    long = session_name()
    assert len(long.encode()) == postgres.APPLICATION_NAME_BYTES
    assert long.endswith(f"h:{os.getpid()}")
