"""The App stays small: what most callers touch is on it, the rest in its facades."""

from __future__ import annotations

import pytest

from tether import App
from tether.facades import Facade

# Plain data the App carries (its settings and what its code declared), not API.
DATA = {"url", "config", "actor", "tasks", "resources", "hooks"}
MAX_APP_NAMES = 20  # its methods; each facade, one concern, is counted apart
MAX_FACADE_NAMES = 16  # app.jobs: a job's reads (events, artifacts, logs...) and its steering


def public(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


@pytest.fixture
def app() -> App:
    return App("sqlite:///unused.db")


def test_the_app_has_few_public_names(app: App) -> None:
    facades = {n for n in public(app) if isinstance(getattr(app, n), Facade)}
    names = public(app) - DATA - facades
    assert len(names) <= MAX_APP_NAMES, sorted(names)


def test_the_apps_data_is_its_settings_and_declarations(app: App) -> None:
    data = {
        n
        for n in public(app)
        if not callable(getattr(app, n)) and not isinstance(getattr(app, n), Facade)
    }
    assert data == DATA


def test_the_facades_hang_off_the_app(app: App) -> None:
    facades = {n for n in public(app) if isinstance(getattr(app, n), Facade)}
    assert facades == {"jobs", "queues", "cancellations", "schedules", "durable", "admin"}
    for name in facades:
        assert getattr(app, name).app is app


@pytest.mark.parametrize(
    "name", ["jobs", "queues", "cancellations", "schedules", "durable", "admin"]
)
def test_each_facade_has_few_public_names(app: App, name: str) -> None:
    names = public(getattr(app, name))
    assert len(names) <= MAX_FACADE_NAMES, sorted(names)
