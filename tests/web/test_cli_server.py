"""``tether serve`` as a real server process; ``tether token`` and ``tether audit`` against
it (in process, with Typer's runner, which is much faster than more subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tether.cli import cli

from .support import free_port

TETHER = str(Path(sys.executable).with_name("tether"))
APP_SOURCE = """
from tether import App

app = App({url!r})


@app.task(name="echo")
async def echo(ctx, **args):
    return args
"""


@contextmanager
def serving(cwd: Path, *args: str) -> Iterator[tuple[str, list[str]]]:
    """``tether serve`` in a subprocess; yields its URL and, after it stops, its output."""
    port = free_port()
    proc = subprocess.Popen(
        [TETHER, "serve", "--port", str(port), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    base = f"http://127.0.0.1:{port}"
    output: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "tether serve did not start"
            time.sleep(0.05)
        yield base, output
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            output.append(proc.communicate(timeout=15)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            output.append(proc.communicate()[0])


@pytest.mark.slow
def test_serve_tokens_and_audit_end_to_end(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/tether.db"
    (tmp_path / "jobs.py").write_text(APP_SOURCE.format(url=url))
    db = ["--database", url]
    runner = CliRunner()

    def tether(*args: str) -> tuple[int, str, str]:
        res = runner.invoke(cli, [*args, *db], env={"COLUMNS": "200"})
        return res.exit_code, res.stdout, res.stderr

    assert tether("migrate")[0] == 0  # serve, like every command but a few, needs it made
    # No token: a public address is refused before anything listens.
    code, _, err = tether("serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert code == 2 and "refusing to listen on 0.0.0.0" in err

    with serving(tmp_path, *db, "--app", "jobs:app") as (base, output):
        # Loopback without tokens: open, as admin "anonymous" (and it said so loudly).
        res = httpx.post(f"{base}/api/jobs", json={"task": "echo"})
        assert res.status_code == 201 and res.json()["owner"] == "anonymous"

        code, token, err = tether("token", "create", "--name", "ci", "--role", "admin")
        token = token.strip()
        assert code == 0 and token.startswith("tether_") and "shown only this once" in err
        code, listed, _ = tether("token", "list")
        assert "ci" in listed and "active" in listed and token not in listed

        headers = {"Authorization": f"Bearer {token}", "X-Request-ID": "cli-test-1"}
        assert httpx.get(f"{base}/api/stats").status_code == 401  # tokens exist now
        res = httpx.post(f"{base}/api/jobs", json={"task": "echo"}, headers=headers)
        assert res.status_code == 201 and res.json()["owner"] == "ci"
        res = httpx.post(f"{base}/api/jobs/{res.json()['id']}/cancel", headers=headers)
        assert res.json()["outcome"] == "cancelled"
        assert tether("token", "revoke", "ci")[0] == 0
        assert httpx.get(f"{base}/api/stats", headers=headers).status_code == 401
    assert "tether serve is OPEN" in output[0]
    assert token not in output[0] and "Bearer" not in output[0]

    code, out, _ = tether("audit", "--limit", "10", "--json")
    assert code == 0 and token not in out
    rows = json.loads(out)
    actions = [(r["actor"], r["action"], r["result"]) for r in rows]
    assert ("ci", "job.cancel", "ok") in actions and ("ci", "job.enqueue", "ok") in actions
    assert ("unauthenticated", "stats.read", "denied") in actions
    assert ("anonymous", "job.enqueue", "ok") in actions
    assert any(a == "token.revoke" and r == "ok" for _, a, r in actions)
    assert {r["request_id"] for r in rows if r["actor"] == "ci"} == {"cli-test-1"}
    code, table, _ = tether("audit")
    assert "job.cancel" in table and "token.create" in table
