"""Prometheus metrics: the core's instrumentation points, and a worker's own endpoint."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY

from tests.helpers import eventually, fast_config
from tether import App, Worker
from tether.maintenance import Rescuer

from .support import free_port
from .test_cli_server import APP_SOURCE, TETHER


def sample(name: str, **labels: str) -> float:
    """A metric's current value in this process (0 if it has none yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_core_instrumentation_points_count(tapp: App) -> None:
    before = {
        "requests": sample("tether_cancellation_requests_total", force="true"),
        "seconds": sample("tether_cancellation_duration_seconds_count", status="completed"),
        "runners": sample("tether_runners_terminated_total"),
        "latency": sample("tether_job_start_latency_seconds_count", queue="default"),
        "ran": sample("tether_job_run_duration_seconds_count", task="echo", outcome="succeeded"),
        "forced": sample("tether_force_kills_total", executor="async"),
        "zombies": sample("tether_zombies_rescued_total"),
    }
    worker = Worker(tapp, fast_config())
    await worker.start()
    try:
        done = await tapp.enqueue("echo", {"x": 1})
        await tapp.wait(done.id, timeout=10)
        slow = await tapp.enqueue("sleepy", {})
        await eventually(lambda: _running(tapp, slow.id))
        result = await tapp.cancel(slow.id, force=True, wait=10)
        assert result.outcome == "cancelled" and result.runners_terminated
    finally:
        await worker.stop()
    # A zombie: a lease that expired under a worker that vanished.
    store = await tapp.store()
    lost = await tapp.enqueue("echo", {}, queue="zombies")
    await store.claim("gone", ["zombies"], ["echo"], 1, 0.01)
    await asyncio.sleep(0.05)
    rescuer = Rescuer(store, interval=1.0, session_grace=1.0)
    assert [j.id for j in await rescuer.run_once()] == [lost.id]

    assert sample("tether_cancellation_requests_total", force="true") == before["requests"] + 1
    assert (
        sample("tether_cancellation_duration_seconds_count", status="completed")
        == before["seconds"] + 1
    )
    assert sample("tether_runners_terminated_total") == before["runners"] + 1
    assert (
        sample("tether_job_start_latency_seconds_count", queue="default") >= before["latency"] + 2
    )
    assert (
        sample("tether_job_run_duration_seconds_count", task="echo", outcome="succeeded")
        == before["ran"] + 1
    )
    assert sample("tether_force_kills_total", executor="async") == before["forced"] + 1
    assert sample("tether_zombies_rescued_total") == before["zombies"] + 1


async def _running(app: App, job_id: int) -> bool:
    return (await app.get(job_id)).state.value == "running"


@pytest.mark.slow
def test_worker_serves_its_metrics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/tether.db"
    (tmp_path / "jobs.py").write_text(APP_SOURCE.format(url=url))
    port = free_port()
    proc = subprocess.Popen(
        [TETHER, "worker", "--app", "jobs:app", "--metrics-port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                res = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "no metrics endpoint"
                time.sleep(0.05)
        assert res.status_code == 200
        assert "tether_heartbeat_failures_total" in res.text
        assert "tether_lease_losses_total" in res.text
    finally:
        # Sent as soon as the endpoint answers, which can be before the worker has
        # finished starting: one signal must still stop it. A worker that did not stop
        # is killed, never left behind, and fails the test.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, proc.returncode
