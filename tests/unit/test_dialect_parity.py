"""The two dialects stay in step: one migration per change under the same number and
name in both folders, and the same names for their SQL (``store/sql/{sqlite,postgres}``),
less the exceptions listed here with why each exists."""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path

from tether.store.base import load_migrations, migration_version
from tether.store.common.schema import RENUMBERED

DIALECTS = ("sqlite", "postgres")
SQL = Path(str(resources.files("tether.store") / "sql"))

ONE_DIALECT_MODULES = {
    ("sqlite", "workflow"): "SQLite's workflow propagation (store/sqlite_workflow.py); "
    "PostgreSQL's runs inside its transition trigger (tether_workflow_step, migrations)",
}
"""Modules of named SQL that only one dialect has, and why."""

ONE_DIALECT_NAMES = {
    # Building blocks each dialect composes its own statements from.
    ("sqlite", "fragments", "NOW"): "SQLite computes database time as Unix seconds from "
    "julianday('now'); PostgreSQL writes now()",
    ("sqlite", "fragments", "each"): "SQLite expands a list parameter with json_each; "
    "PostgreSQL passes an array (= ANY)",
    ("sqlite", "fragments", "RATE_TOKENS"): "a bucket's tokens as of now, which SQLite's "
    "claim (in Python) and rate-limit listing both read; PostgreSQL's claim refills its "
    "buckets in tether_claim_paced, so only its listing reads them (queues._RATE_TOKENS)",
    # The claim: one statement on PostgreSQL (the base _claim), steps on SQLite.
    ("postgres", "leases", "CLAIM"): "PostgreSQL claims in one statement (the function "
    "tether_claim_paced, run by the base _claim); SQLite's store overrides _claim",
    **{
        ("sqlite", "leases", name): "a step of SQLite's _claim (sqlite.py), which looks "
        "before it locks and admits in Python (store/admission.py)"
        for name in (
            "CLAIM_TAKE",
            "LIMIT_ROOM",
            "RATE_BUCKETS",
            "SPEND_TOKENS",
            "claim_candidates",
            "claim_names",
            "claim_ready",
        )
    },
}
"""Public names that only one dialect's module defines, and why. Names that are ``None``
where a dialect has nothing to run are not exceptions: both dialects define them."""


def defined(dialect: str, module: str) -> dict[str, ast.stmt]:
    """The public names a module of named SQL defines itself (not those it imports)."""
    tree = ast.parse((SQL / dialect / f"{module}.py").read_text("utf-8"))
    out: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        elif isinstance(node, ast.FunctionDef):
            targets = [node.name]
        else:
            continue
        out.update((name, node) for name in targets if not name.startswith("_"))
    return out


def modules(dialect: str) -> set[str]:
    return {p.stem for p in (SQL / dialect).glob("*.py") if p.stem != "__init__"}


def is_none(node: ast.stmt) -> bool:
    value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
    return isinstance(value, ast.Constant) and value.value is None


# -- migrations ----------------------------------------------------------------------------


def test_both_dialects_ship_the_same_migrations_under_the_same_numbers() -> None:
    sqlite, postgres = ([(m.version, m.name) for m in load_migrations(d)] for d in DIALECTS)
    assert sqlite == postgres
    assert len({version for version, _ in sqlite}) == len(sqlite)


def test_a_migration_with_nothing_to_do_says_why() -> None:
    for dialect in DIALECTS:
        for m in load_migrations(dialect):
            lines = [line.strip() for line in m.sql.splitlines() if line.strip()]
            assert lines, f"{dialect}/{m.name} is empty"
            if all(line.startswith("--") for line in lines):
                assert "nothing to do" in m.sql, f"{dialect}/{m.name} does not say why"


def test_a_renumbered_migration_names_a_file_shipped_under_its_new_number_only() -> None:
    for dialect, moves in RENUMBERED.items():
        shipped = {m.name for m in load_migrations(dialect)}
        for old, new in moves:
            assert old not in shipped and new in shipped
            assert migration_version(old) != migration_version(new)


# -- named SQL -----------------------------------------------------------------------------


def test_both_dialects_have_the_same_modules_of_named_sql() -> None:
    only = {(d, m) for d in DIALECTS for m in modules(d) - modules(_other(d))}
    assert only == set(ONE_DIALECT_MODULES)


def test_both_dialects_define_the_same_names_but_the_listed_exceptions() -> None:
    only = set()
    for dialect in DIALECTS:
        for module in modules(dialect) & modules(_other(dialect)):
            theirs = defined(_other(dialect), module)
            only |= {(dialect, module, n) for n in defined(dialect, module) if n not in theirs}
    assert only == set(ONE_DIALECT_NAMES)


def test_a_name_is_none_in_one_dialect_at_most() -> None:
    # None means "nothing to run here"; None in both would be a name nobody runs.
    for module in modules("sqlite") & modules("postgres"):
        sqlite, postgres = defined("sqlite", module), defined("postgres", module)
        for name in sqlite.keys() & postgres.keys():
            assert not (is_none(sqlite[name]) and is_none(postgres[name])), (module, name)


def _other(dialect: str) -> str:
    return "postgres" if dialect == "sqlite" else "sqlite"
