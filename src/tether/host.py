"""What the running layer (a worker and its maintenance services) uses of the
application it runs: its configuration, its declarations and its store.
:class:`~tether.App` is one; the running layer never imports the App itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tether.config import AppConfig
from tether.hooks import Hooks
from tether.periodic import Schedule
from tether.store import Store
from tether.task import Task


class Declared(Protocol):
    """The schedules an application declares in its code, by name."""

    @property
    def declared(self) -> Mapping[str, Schedule]:
        """Each declared schedule by its name."""
        ...


class Host(Protocol):
    """An application as a worker sees it."""

    #: Its database URL (handlers' fenced transactions open connections to it).
    url: str

    @property
    def config(self) -> AppConfig:
        """The application's configuration."""
        ...

    @property
    def tasks(self) -> Mapping[str, Task]:
        """The registered tasks, by name."""
        ...

    @property
    def hooks(self) -> Hooks:
        """Its hooks (the worker runs them around attempts and on outcomes)."""
        ...

    @property
    def schedules(self) -> Declared:
        """Its schedules (the worker records the declared ones)."""
        ...

    async def store(self) -> Store:
        """The running event loop's connected store."""
        ...
