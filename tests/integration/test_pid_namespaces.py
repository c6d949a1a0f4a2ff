"""Two real workers with one host name, one of them in a PID namespace of its own (as
in a container or on a second machine with the same name): neither may judge the other
dead by a pid that means nothing where it looks, on both stores."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import UNSHARE, can_unshare, eventually
from tests.integration.gateapp import build_app
from tether import JobState

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not can_unshare(), reason="needs unshare --pid (root or user ns)"),
]


class Workers:
    """Worker processes of ``gateapp``; none outlives the test."""

    def __init__(self, url: str, gate_dir: Path) -> None:
        self.url = url
        self.gate_dir = gate_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *, own_pid_namespace: bool) -> Path:
        """Start a worker; returns its log, where it says when it has started."""
        log = self.gate_dir / f"worker-{len(self.procs)}.log"
        env = {**os.environ, "TETHER_DATABASE_URL": self.url, "TETHER_GATE_DIR": str(self.gate_dir)}
        cmd = [sys.executable, "-m", "tests.integration.gateapp"]
        with log.open("wb") as err:
            self.procs.append(
                subprocess.Popen(
                    [*UNSHARE, *cmd] if own_pid_namespace else cmd, cwd=ROOT, env=env, stderr=err
                )
            )
        return log

    def starts(self) -> list[str]:
        path = self.gate_dir / "starts.log"
        return path.read_text().splitlines() if path.exists() else []

    async def started_jobs(self) -> list[str]:
        return self.starts()

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(db_url, tmp_path)
    yield w
    w.kill_all()


async def _started(log: Path) -> bool:
    # Logged after the opening, whose rescue round looks at every worker row.
    return "started: queues=" in await asyncio.to_thread(log.read_text, errors="replace")


@pytest.mark.parametrize("holder_in_namespace", [False, True], ids=["host-holds", "ns-holds"])
async def test_worker_in_another_pid_namespace_does_not_rescue_a_live_job(
    workers: Workers, db_url: str, holder_in_namespace: bool
) -> None:
    app = build_app(db_url)
    try:
        await app.admin.migrate()
        holder = workers.start(own_pid_namespace=holder_in_namespace)
        await eventually(lambda: _started(holder), timeout=30)
        job = await app.enqueue("gated")
        await eventually(workers.started_jobs, timeout=30)

        # The second worker's opening rescue round runs before it says it started; its
        # periodic rounds, and the holder's, keep running while the job waits at the gate.
        other = workers.start(own_pid_namespace=not holder_in_namespace)
        await eventually(lambda: _started(other), timeout=30)
        (workers.gate_dir / "open").touch()
        done = await app.wait(job.id, timeout=30)
        rescues = [e for e in await app.jobs.events(job.id) if e.actor == "rescuer"]
        both = await app.admin.workers()
        assert len({w.host for w in both}) == 1  # one host name, two PID namespaces
        assert {
            "executions": len(workers.starts()),
            "attempt": done.attempt,
            "state": done.state,
            "rescues": [e.reason for e in rescues],
            "workers": [w.state for w in both],
        } == {
            "executions": 1,
            "attempt": 1,
            "state": JobState.SUCCEEDED,
            "rescues": [],
            "workers": ["active", "active"],
        }
    finally:
        await app.close()
