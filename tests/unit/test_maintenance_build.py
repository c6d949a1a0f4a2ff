"""The maintenance services are built as one unit, sharing the worker's settings."""

from __future__ import annotations

import asyncio
from typing import Any

from tether import App, MaintenanceConfig, WorkerConfig
from tether.config import AppConfig, LoopBackoff
from tether.maintenance import build_maintenance
from tether.maintenance.pruner import BACKOFF as PRUNER_BACKOFF


def _built(config: WorkerConfig) -> Any:
    app = App("sqlite:///unused.db", config=AppConfig(maintenance=MaintenanceConfig(lock_wait=0.5)))
    store: Any = object()  # nothing is called at construction
    return build_maintenance(app, store, "w1", config)


async def test_the_services_share_the_workers_backoff_and_one_leader() -> None:
    backoff = LoopBackoff(after_errors=5, ceiling=7.0)
    built = _built(WorkerConfig(backoff=backoff))
    services = built.services
    assert {s.name for s in services} == {
        "rescuer",
        "cancellation follow-up",
        "leader election",
        "pruner",
        "scheduler",
        "releaser",
    }
    # The pruner runs once a minute: a worker's ceiling would shorten its waits.
    assert [s.backoff for s in services if s is not built.pruner] == [backoff] * 5
    assert built.pruner.backoff is PRUNER_BACKOFF
    assert {s.lock_wait for s in services} == {0.5}
    duties = [built.rescuer, built.follow_up, built.pruner, built.scheduler, built.releaser]
    assert all(d.leader is built.leader for d in duties)


async def test_the_services_start_and_stop_together() -> None:
    built = _built(WorkerConfig())
    for service in built.services:
        service.interval = 3600.0
        service.round = _nothing  # type: ignore[method-assign]
    tasks = built.start()
    assert len(tasks) == len(built.services)
    await asyncio.sleep(0)
    built.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)


async def _nothing() -> None:
    pass
