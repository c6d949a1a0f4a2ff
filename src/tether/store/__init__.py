"""Stores: where tether keeps its jobs. ``open_store(url)`` picks one by URL scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from tether.config import StoreConfig
from tether.errors import ConfigError
from tether.store.base import Store

__all__ = ["Store", "create_store", "parse_sqlite_path"]


def parse_sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///relative.db`` or ``sqlite:////abs.db`` URL."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise ConfigError(f"malformed SQLite URL {url!r}: expected sqlite:///path/to/file.db")
    path = url[len(prefix) :]
    if not path or path.endswith("/"):
        raise ConfigError(f"malformed SQLite URL {url!r}: it names no file")
    if path == ":memory:" or path.startswith("file::memory"):
        raise ConfigError("tether needs a SQLite file that workers can share, not :memory:")
    return path


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

        return SqliteStore(url, parse_sqlite_path(url))
    if scheme in ("postgresql", "postgres"):
        parts = urlsplit(url)
        if not parts.hostname and not parts.path.strip("/") and "host=" not in (parts.query or ""):
            raise ConfigError(f"malformed PostgreSQL URL {url!r}: it names no host or database")
        from tether.store.postgres import PostgresStore

        return PostgresStore(url, config)
    raise ConfigError(
        f"unsupported database URL {url!r}: use sqlite:///path.db or postgresql://host/db"
    )
