"""The maintenance commands: prune, schedule list|pause|resume|remove, and the leader in
workers."""

from __future__ import annotations

import json
import secrets
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.test_cli import claim_one, succeed, with_app, with_store
from tether.cli import cli
from tether.ops import MAINTENANCE
from tether.store import Store, parse_sqlite_path

APP_SOURCE = """
from tether import App

app = App({url!r})


@app.task(name="hello")
async def hello(ctx, name="world"):
    return name


@app.periodic(cron="0 9 * * 1-5", timezone="Europe/Paris", name="morning", args={{"name": "x"}})
async def morning(ctx, name):
    return name
"""


@pytest.fixture
def app_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> Iterator[str]:
    name = f"cli_ops_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(APP_SOURCE.format(url=sqlite_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("TETHER_APP", raising=False)
    monkeypatch.delenv("TETHER_DATABASE_URL", raising=False)
    yield f"{name}:app"
    sys.modules.pop(name, None)


def tether(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def backdate(url: str, job_id: int, days: float) -> None:
    with sqlite3.connect(parse_sqlite_path(url)) as conn:
        conn.execute(
            "UPDATE tether_jobs SET finished_at = finished_at - ? WHERE id = ?",
            (days * 86400, job_id),
        )


def test_prune_dry_run_counts_then_prune_deletes(app_ref: str, sqlite_url: str) -> None:
    tether("enqueue", "hello", "--app", app_ref)
    old = claim_one(sqlite_url)
    succeed(sqlite_url, old)
    tether("enqueue", "hello", "--app", app_ref)
    succeed(sqlite_url, claim_one(sqlite_url))
    backdate(sqlite_url, old.id, 2)

    dry = tether("prune", "--app", app_ref, "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["counts"]["jobs"] == 1
    assert sum(with_app(sqlite_url, lambda a: a.jobs.stats()).values()) == 2

    res = tether("prune", "--app", app_ref)
    assert res.exit_code == 0, res.output
    assert "deleted" in res.stdout and "jobs" in res.stdout
    assert "succeeded:" in res.stderr  # progress
    assert sum(with_app(sqlite_url, lambda a: a.jobs.stats()).values()) == 1
    # --older-than overrides the retention: the recent one goes too.
    res = tether("prune", "--app", app_ref, "--older-than", "0s", "--state", "succeeded", "--json")
    assert json.loads(res.stdout)["counts"]["jobs"] == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--state", "running"], "only finished jobs"), (["--older-than", "7 parsecs"], "bad age")],
)
def test_prune_refuses_bad_input(app_ref: str, args: list[str], needle: str) -> None:
    res = tether("prune", "--app", app_ref, *args)
    assert res.exit_code == 2 and needle in res.stderr


def test_schedule_list_pause_and_resume(app_ref: str) -> None:
    listed = json.loads(tether("schedule", "list", "--app", app_ref, "--json").stdout)
    [row] = listed
    assert (row["name"], row["cron"], row["timezone"], row["paused"]) == (
        "morning",
        "0 9 * * 1-5",
        "Europe/Paris",
        False,
    )
    assert row["next_tick"] is not None
    assert tether("schedule", "pause", "morning", "--app", app_ref).exit_code == 0
    table = tether("schedule", "list", "--app", app_ref)
    assert "morning" in table.stdout and "paused" in table.stdout
    assert tether("schedule", "resume", "morning", "--app", app_ref).exit_code == 0
    [row] = json.loads(tether("schedule", "list", "--app", app_ref, "--json").stdout)
    assert row["paused"] is False
    missing = tether("schedule", "pause", "nope", "--app", app_ref)
    assert missing.exit_code == 1 and "no schedule named 'nope'" in missing.stderr
    # Recorded (by the pause above), declared by no live worker: removed for good.
    assert row["declared_by"] == 0 and "no live worker" in table.stdout
    removed = tether("schedule", "remove", "morning", "--app", app_ref)
    assert removed.exit_code == 0 and "removed" in removed.stdout, removed.output
    assert "still declare" not in removed.stdout
    gone = tether("schedule", "remove", "morning", "--app", app_ref)
    assert gone.exit_code == 1 and "no schedule named 'morning'" in gone.stderr


def test_workers_names_the_maintenance_leader(sqlite_url: str) -> None:
    async def register(store: Store) -> None:
        await store.register_worker("host:1:aa", None, "host", 1, None, ["default"], 1)

    async def lead(store: Store) -> None:
        await store.lead(MAINTENANCE, "host:1:aa", 60)

    with_store(sqlite_url, register)
    none = "maintenance leader: none (no worker has run yet"
    assert none in tether("workers", "-d", sqlite_url).stdout
    with_store(sqlite_url, lead)
    res = tether("workers", "-d", sqlite_url)
    assert "★ leader" in res.stdout and "maintenance leader: host:1:aa" in res.stdout
    [w] = json.loads(tether("workers", "-d", sqlite_url, "--json").stdout)
    assert w["leader"] is True
