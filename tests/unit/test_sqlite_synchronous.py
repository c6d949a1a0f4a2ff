"""The SQLite store's ``synchronous`` level comes from the URL (``?synchronous=full``)."""

from __future__ import annotations

import os

import pytest

from tether.errors import ConfigError
from tether.store import create_store, parse_sqlite_path
from tether.store.sqlite import SqliteStore

# PRAGMA synchronous reads back as a number.
LEVELS = {"normal": 1, "full": 2, "extra": 3}


async def _pragma_on_store_connection(url: str) -> int:
    store = create_store(url)
    assert isinstance(store, SqliteStore)
    await store.open()
    try:
        await store.migrate()
        # The pragma is per connection: read it on the store's own one.
        return int(
            await store._call(lambda: store._db().execute("PRAGMA synchronous").fetchone()[0])
        )
    finally:
        await store.close()


async def test_the_default_synchronous_level_is_normal(sqlite_url: str) -> None:
    assert await _pragma_on_store_connection(sqlite_url) == LEVELS["normal"]


@pytest.mark.parametrize("level", ["full", "FULL", "extra", "normal"])
async def test_the_url_sets_the_synchronous_level_of_the_store_connection(
    sqlite_url: str, level: str
) -> None:
    url = f"{sqlite_url}?synchronous={level}"
    assert await _pragma_on_store_connection(url) == LEVELS[level.lower()]


async def test_the_synchronous_option_is_not_part_of_the_file_name(sqlite_url: str) -> None:
    url = f"{sqlite_url}?synchronous=full"
    assert parse_sqlite_path(url) == parse_sqlite_path(sqlite_url)
    await _pragma_on_store_connection(url)
    folder = os.path.dirname(parse_sqlite_path(sqlite_url))
    assert "tether.db" in os.listdir(folder)
    assert not [name for name in os.listdir(folder) if "?" in name]


@pytest.mark.parametrize(
    ("query", "message"),
    [("synchronous=off", "synchronous level 'off'"), ("cache=shared", "unknown SQLite URL")],
)
def test_unknown_sqlite_url_options_are_refused(sqlite_url: str, query: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        create_store(f"{sqlite_url}?{query}")
