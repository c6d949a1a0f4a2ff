"""The layers point one way: the web layer, the CLI and the demo reach data only through
the App or a named service, never the store itself; the running layer (``worker/``,
``maintenance/``) never imports the App above it; the worker's parts reach the worker
only through their ports, never its module; the store's protocols make up ``Store``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tether
from tether.store import Store, protocols
from tether.store.sqlite import SqliteStore

PACKAGE = Path(tether.__file__).parent


def _modules(name: str) -> list[Path]:
    """The modules of the part ``name`` of tether (a module or a package)."""
    found = sorted(p for p in PACKAGE.glob(f"{name}*.py"))
    found += sorted(p for d in PACKAGE.glob(f"{name}*") if d.is_dir() for p in d.rglob("*.py"))
    return found


def edge_modules() -> list[Path]:
    """The modules of the web layer, the CLI and the demo."""
    return _modules("web") + _modules("cli") + _modules("demo")


def running_modules() -> list[Path]:
    """The modules of the worker and its maintenance services."""
    return _modules("worker") + _modules("maintenance")


def _is_store_module(name: str) -> bool:
    return name == "tether.store" or name.startswith("tether.store.")


def store_reaches(source: str) -> list[str]:
    """Where ``source`` imports the store package or calls something's ``store()``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hits: list[str] = []
        if isinstance(node, ast.Import):
            hits = [f"import {a.name}" for a in node.names if _is_store_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if _is_store_module(module) or (
                module == "tether" and any(a.name == "store" for a in node.names)
            ):
                hits = [f"from {module} import ..."]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "store"
        ):
            hits = [".store()"]
        found += [f"line {getattr(node, 'lineno', 0)}: {hit}" for hit in hits]
    return found


def app_imports(source: str) -> list[str]:
    """Where ``source`` imports the App's module (or the App from the package)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.Import):
            hit = any(a.name == "tether.app" for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            hit = module == "tether.app" or (
                module == "tether" and any(a.name in ("app", "App") for a in node.names)
            )
        if hit:
            found.append(f"line {getattr(node, 'lineno', 0)}: imports the App")
    return found


def test_the_edge_modules_are_found() -> None:
    names = {p.relative_to(PACKAGE).parts[0] for p in edge_modules()}
    assert "web" in names
    assert names & {"cli.py", "cli"}
    assert "demo" in names


def test_the_running_modules_are_found() -> None:
    names = {p.relative_to(PACKAGE).parts[0] for p in running_modules()}
    assert names == {"worker", "maintenance"}


@pytest.mark.parametrize(
    "source",
    [
        "store = await app.store()",
        "await (await self.app.store()).list_tokens()",
        "from tether.store import create_store",
        "from tether.store.base import load_migrations",
        "import tether.store.sqlite",
        "from tether import store",
    ],
)
def test_the_check_finds_a_reach_into_the_store(source: str) -> None:
    assert store_reaches(source)


def test_the_check_leaves_app_calls_and_store_config_alone() -> None:
    source = "await app.jobs.feed(flt)\nsize = app.config.store.pool_size\nApp.sqlite_file(url)"
    assert store_reaches(source) == []


@pytest.mark.parametrize("path", edge_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_web_layer_and_the_cli_go_through_the_app(path: Path) -> None:
    assert store_reaches(path.read_text("utf-8")) == [], (
        f"{path.relative_to(PACKAGE)} reaches past App into the store: add an App method "
        "or a named service instead"
    )


def _members(protocol: type) -> set[str]:
    """The methods and attributes a protocol declares itself."""
    own = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    return own | set(vars(protocol).get("__annotations__", {}))


PARTS = [getattr(protocols, name) for name in protocols.__all__ if name != "ProcessGone"]


def test_store_is_the_composition_of_every_protocol() -> None:
    assert set(PARTS) <= set(Store.__mro__)
    assert _members(Store) == set()  # Store adds nothing of its own


def test_each_store_method_belongs_to_one_concern() -> None:
    # ``hints`` is shared by the protocols whose callers wait for changes.
    methods = [_members(p) - {"hints"} for p in PARTS]
    assert sum(len(m) for m in methods) == len(set().union(*methods))


def test_each_protocol_says_what_it_owns() -> None:
    for part in PARTS:
        assert part.__doc__, part.__name__
        assert _members(part), part.__name__


def test_a_store_implements_every_protocol() -> None:
    store = SqliteStore("sqlite:///unused.db", "unused.db")
    for part in PARTS:
        assert isinstance(store, part), part.__name__
    assert isinstance(store, Store)


def worker_reaches(source: str) -> list[str]:
    """Where ``source`` imports the Worker's module, or the package that re-exports it
    (under ``TYPE_CHECKING`` too: a type is a dependency all the same)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else [f".{node.module or ''}"]
        found += [
            f"line {node.lineno}: {name}"
            for name in names
            if name in ("tether.worker", "tether.worker.worker", ".worker")
        ]
    return found


@pytest.mark.parametrize(
    "source",
    [
        "from tether.worker.worker import Worker",
        "if TYPE_CHECKING:\n    from tether.worker.worker import Worker",
        "import tether.worker.worker",
        "from tether.worker import Worker",
        "from .worker import Worker",
    ],
)
def test_the_check_finds_an_import_of_the_worker(source: str) -> None:
    assert worker_reaches(source)


def test_the_check_leaves_the_parts_imports_alone() -> None:
    assert (
        worker_reaches("from tether.worker.ports import Launcher\nimport tether.worker.run") == []
    )


WORKER_PARTS = sorted(
    p for p in (PACKAGE / "worker").glob("*.py") if p.name not in ("worker.py", "__init__.py")
)


@pytest.mark.parametrize("path", WORKER_PARTS, ids=lambda p: p.name)
def test_the_worker_parts_never_import_the_worker(path: Path) -> None:
    assert worker_reaches(path.read_text("utf-8")) == [], (
        f"worker/{path.name} reaches for the Worker: give it a port (worker/ports.py) "
        "or a callable for what it needs instead"
    )
