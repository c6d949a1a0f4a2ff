"""The boundary between tether and its databases.

Everything above this package talks to a :class:`Store`, or better to the narrowest of
the protocols it is made of (:mod:`tether.store.protocols`); only the modules in this
package speak SQL or import a database driver. Both stores pass the same conformance
suite (``tests/conformance``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Protocol, runtime_checkable

from tether.errors import InvalidJobError
from tether.store.protocols import (
    AuthStore,
    CancellationStore,
    FeedStore,
    JobLogStore,
    JobStore,
    LeaseStore,
    MaintenanceStore,
    ProcessGone,
    QueueStore,
    ScheduleStore,
    SchemaStore,
    StepStore,
    WorkerStore,
)

__all__ = [
    "Migration",
    "ProcessGone",
    "Store",
    "check_dependencies",
    "load_migrations",
    "migration_version",
    "shipped_versions",
]


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str


def load_migrations(dialect: str) -> list[Migration]:
    """The migrations shipped for ``dialect``, in order."""
    folder = resources.files("tether.store") / "migrations" / dialect
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = migration_version(entry.name)
            found.append(Migration(version, entry.name, entry.read_text("utf-8")))
    return sorted(found, key=lambda m: m.version)


def migration_version(name: str) -> int:
    """The version a migration file's name starts with (``0006_x.sql``: 6)."""
    return int(name.split("_", 1)[0])


def shipped_versions(url: str) -> set[int]:
    """The migration versions this code ships for the database at ``url``."""
    dialect = "sqlite" if url.startswith("sqlite") else "postgres"
    return {m.version for m in load_migrations(dialect)}


def check_dependencies(wanted: Sequence[int], found: dict[int, str]) -> None:
    """Refuse dependencies that do not exist or can never succeed (``found``: the state
    of each job known, a superset of ``wanted`` or not)."""
    missing = sorted({i for i in wanted if i not in found})
    if missing:
        raise InvalidJobError(f"unknown dependency id(s): {', '.join(map(str, missing))}")
    dead = sorted({i for i in wanted if found[i] in ("failed", "cancelled")})
    if dead:
        raise InvalidJobError(
            f"dependency {dead[0]} is {found[dead[0]]}; a job depending on it could never run"
        )


@runtime_checkable
class Store(
    SchemaStore,
    JobStore,
    LeaseStore,
    QueueStore,
    CancellationStore,
    AuthStore,
    FeedStore,
    WorkerStore,
    MaintenanceStore,
    ScheduleStore,
    StepStore,
    JobLogStore,
    Protocol,
):
    """What tether needs from a database: every concern's protocol at once (see
    :mod:`tether.store.protocols`). Every method is a short transaction.

    Only the App, which owns one store per event loop, and the worker hold a whole
    ``Store``; everything else asks for the protocols it uses.
    """
