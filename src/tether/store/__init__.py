"""Stores: where tether keeps its jobs. ``open_store(url)`` picks one by URL scheme."""

from __future__ import annotations

import secrets
from urllib.parse import parse_qsl, urlencode, urlsplit

from tether.config import StoreConfig
from tether.errors import ConfigError, InvalidJobError
from tether.store.base import Store

__all__ = [
    "MEMORY_URL",
    "Store",
    "caller_store",
    "create_store",
    "memory_url",
    "parse_sqlite_path",
    "sqlite_synchronous",
]

#: SQLite ``synchronous`` levels a URL may ask for (``?synchronous=full``). ``off`` is not
#: one: it lets a crash of the operating system corrupt the file.
SYNCHRONOUS_LEVELS = ("normal", "full", "extra")
DEFAULT_SYNCHRONOUS = "normal"


def _split_sqlite_options(path: str) -> tuple[str, dict[str, str]]:
    """Split tether's own options (``synchronous``) off a SQLite URL's path."""
    base, sep, query = path.partition("?")
    if not sep:
        return path, {}
    pairs = parse_qsl(query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k == "synchronous"}
    rest = [(k, v) for k, v in pairs if k != "synchronous"]
    if rest and not base.startswith("file:"):
        names = ", ".join(sorted({k for k, _ in rest}))
        raise ConfigError(f"unknown SQLite URL option(s) {names}: only synchronous is known")
    return (f"{base}?{urlencode(rest)}" if rest else base), ours


def sqlite_synchronous(url: str) -> str:
    """The ``synchronous`` level a SQLite URL asks for (``normal`` unless it says).

    ``sqlite:///tether.db?synchronous=full`` makes every commit wait for the disk, so an
    operating-system crash or power loss cannot lose it either; ``normal`` (the default)
    in WAL mode survives any crash of the process.
    """
    options = _split_sqlite_options(url.removeprefix("sqlite:///"))[1]
    level = options.get("synchronous", DEFAULT_SYNCHRONOUS).lower()
    if level not in SYNCHRONOUS_LEVELS:
        raise ConfigError(
            f"unknown SQLite synchronous level {level!r} in {url!r}: use "
            + ", ".join(SYNCHRONOUS_LEVELS)
        )
    return level


def parse_sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///relative.db`` or ``sqlite:////abs.db`` URL."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise ConfigError(f"malformed SQLite URL {url!r}: expected sqlite:///path/to/file.db")
    path = _split_sqlite_options(url[len(prefix) :])[0]
    if not path or path.endswith("/"):
        raise ConfigError(f"malformed SQLite URL {url!r}: it names no file")
    if path.startswith("file:tether-") and "mode=memory" in path:
        return path  # a private in-memory database (see memory_url)
    if path == ":memory:" or path.startswith("file::memory"):
        raise ConfigError(
            "tether needs a SQLite file that workers can share, not :memory: "
            f"(for tests, {MEMORY_URL} is one in-memory database per App)"
        )
    return path


MEMORY_URL = "sqlite://:memory:"
"""An in-memory database for tests: each App given it gets its own (see memory_url)."""


def memory_url() -> str:
    """The URL of a fresh in-memory SQLite database, for one App (which opens it)."""
    return f"sqlite:///file:tether-{secrets.token_hex(8)}?mode=memory"


def create_store(url: str, config: StoreConfig | None = None) -> Store:
    """Build the store for a database URL (not yet connected).

    ``sqlite:///path.db`` gives the embedded store, ``postgresql://...`` the PostgreSQL one
    (with ``config``'s pool and deadlines; the URL's query parameters win).
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("the database URL is empty")
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        from tether.store.sqlite import SqliteStore

        return SqliteStore(url, parse_sqlite_path(url), synchronous=sqlite_synchronous(url))
    if scheme in ("postgresql", "postgres"):
        parts = urlsplit(url)
        if not parts.hostname and not parts.path.strip("/") and "host=" not in (parts.query or ""):
            raise ConfigError(f"malformed PostgreSQL URL {url!r}: it names no host or database")
        from tether.store.postgres import PostgresStore

        return PostgresStore(url, config)
    raise ConfigError(
        f"unsupported database URL {url!r}: use sqlite:///path.db or postgresql://host/db"
    )


def caller_store(url: str, connection: object) -> Store:
    """A store for ``url`` whose writes join ``connection``'s open transaction.

    ``connection`` is a psycopg 3 connection (async or blocking) to the PostgreSQL
    database, or a ``sqlite3.Connection`` to the same SQLite file. Jobs enqueued through
    it commit or roll back with the caller's own writes.
    """
    import sqlite3

    scheme = urlsplit(url).scheme.lower()
    if isinstance(connection, sqlite3.Connection):
        if scheme != "sqlite":
            raise InvalidJobError("a sqlite3 connection was given, but the app uses PostgreSQL")
        from tether.store.sqlite import CallerSqliteStore

        return CallerSqliteStore(url, parse_sqlite_path(url), connection)
    import psycopg

    if isinstance(connection, psycopg.AsyncConnection | psycopg.Connection):
        if scheme not in ("postgresql", "postgres"):
            raise InvalidJobError("a psycopg connection was given, but the app uses SQLite")
        from tether.store.postgres import CallerPostgresStore

        return CallerPostgresStore(url, connection)
    raise InvalidJobError(
        "connection must be a psycopg 3 connection or a sqlite3.Connection, "
        f"not {type(connection).__name__}"
    )
