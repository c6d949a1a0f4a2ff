"""Every change made through the CLI leaves an audit row naming the local user, and the
CLI refuses names outside the safe alphabet. On both stores."""

from __future__ import annotations

import asyncio
import getpass
import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tether import App
from tether.audit import Audit
from tether.cli import cli

APP_SOURCE = """
from tether import App

app = App({url!r})


@app.task(name="hello")
async def hello(ctx, name="world"):
    return name


@app.task(name="boom")
async def boom(ctx):
    raise RuntimeError("boom")
"""


@pytest.fixture
def app_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_url: str) -> Iterator[str]:
    name = f"cli_audit_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(APP_SOURCE.format(url=db_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("TETHER_APP", raising=False)
    monkeypatch.delenv("TETHER_DATABASE_URL", raising=False)
    yield f"{name}:app"


def tether(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def enqueue(app_ref: str, *extra: str) -> int:
    res = tether("enqueue", "hello", "--app", app_ref, "--json", *extra)
    assert res.exit_code == 0, res.output
    job_id: int = json.loads(res.stdout)["id"]
    return job_id


def audit_rows(db_url: str) -> list[tuple[str, str, str | None, str]]:
    async def read() -> list[tuple[str, str, str | None, str]]:
        app = App(db_url)
        try:
            rows = await Audit(app).list(1000)
            return [(r.actor, r.action, r.target, r.result) for r in reversed(rows)]
        finally:
            await app.close()

    return asyncio.run(read())


def test_every_cli_change_is_audited_as_the_os_user(app_ref: str, db_url: str) -> None:
    first = enqueue(app_ref, "--delay", "3600")
    second = enqueue(app_ref, "--delay", "3600")
    for args in (
        ("job", "pause", str(first)),
        ("job", "resume", str(first)),
        ("job", "cancel", str(first), "--wait", "0"),
        ("job", "retry", str(second)),  # refused: it has not failed
        ("job", "delete", str(second)),
        ("queue", "pause", "mail", "--create"),
        ("queue", "resume", "mail", "--create"),
        ("key", "configure", "tenant-1", "--max-running", "2"),
    ):
        res = tether(*args, "-d", db_url)
        assert res.exit_code in (0, 1), (args, res.output)
    actor = f"cli:{getpass.getuser()}"
    assert audit_rows(db_url) == [
        (actor, "job.enqueue", f"job:{first}", "ok"),
        (actor, "job.enqueue", f"job:{second}", "ok"),
        (actor, "job.pause", f"job:{first}", "ok"),
        (actor, "job.resume", f"job:{first}", "ok"),
        (actor, "job.cancel", f"job:{first}", "ok"),
        (actor, "job.retry", f"job:{second}", "failed"),
        (actor, "job.delete", f"job:{second}", "ok"),
        (actor, "queue.pause", "queue:mail", "ok"),
        (actor, "queue.resume", "queue:mail", "ok"),
        (actor, "key.configure", "key:tenant-1", "ok"),
    ]


def test_the_cli_refuses_unsafe_names(app_ref: str, db_url: str) -> None:
    assert tether("migrate", "-d", db_url).exit_code == 0
    for args in (
        ("queue", "pause", "../jobs/38", "-d", db_url),
        ("key", "configure", "a/b", "-d", db_url),
        ("enqueue", "hello", "--app", app_ref, "--queue", "../jobs/38"),
        ("enqueue", "hello", "--app", app_ref, "--key", "a b"),
    ):
        res = tether(*args)
        assert res.exit_code != 0, args
        assert "name" in res.stderr and "Traceback" not in res.output, args
    assert [r[3] for r in audit_rows(db_url)] == ["failed"] * 4
