"""Periodic jobs: one job per tick however many schedulers run, across restarts, and a
new maintenance leader taking over from a dead one. Time is a settable clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers import eventually, fast_config
from tether import App, AppConfig, Worker
from tether.config import MaintenanceConfig, RetentionConfig
from tether.errors import ScheduleNotFoundError
from tether.job import Job
from tether.maintenance import Scheduler
from tether.ops import ScheduleRow
from tether.periodic import Missed


class Clock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def at(self, hh: int, mm: int, ss: float = 0.0) -> None:
        base = self.now.replace(hour=hh, minute=mm, second=0, microsecond=0)
        self.now = base + timedelta(seconds=ss)


def at(hh: int, mm: int) -> datetime:
    return datetime(2026, 3, 2, hh, mm, tzinfo=UTC)


def build(url: str, missed: Missed = "none", **config: object) -> App:
    """A separate App (its own store and connections, as another worker process has)."""
    app = App(url, config=AppConfig(wait_poll_interval=0.05, **config))  # type: ignore[arg-type]

    @app.periodic(cron="*/5 * * * *", name="report", args={"kind": "daily"}, missed=missed)
    async def report(ctx: object, kind: str) -> str:
        return kind

    return app


@pytest.fixture
async def apps(db_url: str) -> AsyncIterator[Callable[..., App]]:
    made: list[App] = []

    def make(missed: Missed = "none", **config: object) -> App:
        app = build(db_url, missed, **config)
        made.append(app)
        return app

    yield make
    for app in made:
        await app.close()


async def scheduler(app: App, clock: Clock) -> Scheduler:
    return Scheduler(app, await app.store(), interval=1.0, clock=clock)


async def scheduled_jobs(app: App) -> list[Job]:
    return sorted(await app.jobs.list(limit=1000), key=lambda j: j.id)


def keys(jobs: list[Job]) -> list[str]:
    return [j.idempotency_key or "" for j in jobs]


def key(hh: int, mm: int) -> str:
    return f"schedule:report:{at(hh, mm).isoformat()}"


async def test_three_workers_enqueue_exactly_one_job_per_tick(
    apps: Callable[..., App],
) -> None:
    clock = Clock(at(12, 1))
    schedulers = [await scheduler(apps(), clock) for _ in range(3)]
    for s in schedulers:
        assert await s.run_once() == []
    for hh, mm in ((12, 5), (12, 10), (12, 15)):
        clock.at(hh, mm, 0.4)
        # All three at once, as three leaders overlapping would.
        await asyncio.gather(*(s.run_once() for s in schedulers))
        # And once more each, as a late round would.
        for s in schedulers:
            await s.run_once()
    jobs = await scheduled_jobs(schedulers[0].app)
    assert keys(jobs) == [key(12, 5), key(12, 10), key(12, 15)]
    assert all(j.args == {"kind": "daily"} for j in jobs)
    [row] = await schedulers[1].app.schedules.list()
    assert row.last_tick == at(12, 15) and row.last_job_id == jobs[-1].id
    assert row.next_tick is not None


async def test_a_restart_neither_repeats_a_tick_nor_leaves_a_gap(
    apps: Callable[..., App],
) -> None:
    clock = Clock(at(12, 1))
    first = await scheduler(apps(), clock)
    await first.run_once()
    clock.at(12, 5, 1)
    assert len(await first.run_once()) == 1
    # The worker restarts (a new process) before the next tick: nothing repeats...
    clock.at(12, 7)
    second = await scheduler(apps(), clock)
    assert await second.run_once() == []
    # ...and a tick that passed during a short restart still runs, late.
    clock.at(12, 10, 20)
    third = await scheduler(apps(), clock)
    assert len(await third.run_once()) == 1
    assert keys(await scheduled_jobs(third.app)) == [key(12, 5), key(12, 10)]


@pytest.mark.parametrize(
    ("missed", "expected"),
    [("none", [key(12, 5), key(12, 35)]), ("latest", [key(12, 5), key(12, 30), key(12, 35)])],
)
async def test_ticks_missed_while_no_worker_ran_follow_the_policy(
    apps: Callable[..., App], missed: Missed, expected: list[str]
) -> None:
    clock = Clock(at(12, 1))
    s = await scheduler(apps(missed), clock)
    await s.run_once()
    clock.at(12, 5, 1)
    await s.run_once()
    # No worker from 12:06 to 12:31:30: ticks 12:10 to 12:30 pass unseen.
    clock.at(12, 31, 30)
    later = await scheduler(apps(missed), clock)
    await later.run_once()
    clock.at(12, 35, 1)
    await later.run_once()
    assert keys(await scheduled_jobs(s.app)) == expected


async def test_a_paused_schedule_skips_its_ticks_until_resumed(
    apps: Callable[..., App],
) -> None:
    clock = Clock(at(12, 1))
    app = apps()
    s = await scheduler(app, clock)
    await s.run_once()
    await app.schedules.pause("report")
    clock.at(12, 5, 1)
    assert await s.run_once() == []
    [row] = await app.schedules.list()
    assert row.paused and row.last_tick == at(12, 5)
    await app.schedules.resume("report")
    clock.at(12, 10, 1)
    assert keys(await s.run_once()) == [key(12, 10)]
    with pytest.raises(ScheduleNotFoundError):
        await app.schedules.pause("nope")


async def test_killing_the_leader_hands_over_and_the_next_tick_runs_once(
    apps: Callable[..., App],
) -> None:
    maintenance = MaintenanceConfig(leader_ttl=0.5, leader_renew_interval=0.1)
    clock = Clock(at(12, 1))
    workers = []
    for _ in range(2):
        w = Worker(apps(maintenance=maintenance), fast_config())
        await w.start(services=False)
        w.maintenance.scheduler.clock = clock
        workers.append(w)
    old, new = workers
    assert await old.maintenance.leader.run_once() and not await new.maintenance.leader.run_once()
    assert (await new.app.admin.leader()).holder == old.id  # type: ignore[union-attr]
    await old.maintenance.scheduler.run_once()
    assert await new.maintenance.scheduler.run_once() == []  # not the leader: does nothing
    # The leader is killed: it renews no more. Within the lease, another takes over.
    loop = asyncio.get_running_loop()
    killed = loop.time()
    while not await new.maintenance.leader.run_once():
        assert loop.time() - killed < 5.0, "no new leader within 5 s"
        await asyncio.sleep(0.05)
    assert not old.maintenance.leader.leading
    assert (await old.app.admin.leader()).holder == new.id  # type: ignore[union-attr]
    clock.at(12, 5, 2)
    await new.maintenance.scheduler.run_once()
    await old.maintenance.scheduler.run_once()  # the old leader, if only frozen, acts no more
    await new.maintenance.scheduler.run_once()
    assert keys(await scheduled_jobs(new.app)) == [key(12, 5)]
    for w in workers:
        await w.stop()


async def test_a_running_worker_leads_fires_schedules_and_prunes_on_its_own(
    db_url: str,
) -> None:
    config = AppConfig(
        wait_poll_interval=0.05,
        retention=RetentionConfig(succeeded=0.0, interval=0.1, batch_pause=0),
        maintenance=MaintenanceConfig(
            leader_ttl=0.5, leader_renew_interval=0.1, schedule_interval=0.1
        ),
    )
    app = App(db_url, config=config)

    @app.periodic(cron="* * * * * *", name="every-second")  # cronsim's six fields: seconds
    async def beat(ctx: object) -> str:
        return "beat"

    worker = Worker(app, fast_config())
    await worker.start()
    try:
        leader = await eventually(app.admin.leader)
        assert leader.holder == worker.id
        # Ticks are enqueued, run, succeed and (with a zero retention) are pruned.
        [row] = await eventually(lambda: _with_job(app))
        assert row.last_job_id is not None
        await eventually(lambda: _gone(app, row.last_job_id or 0))
    finally:
        await worker.stop()
        await app.close()
    # A graceful stop hands the lead back at once.
    other = App(db_url)
    assert await other.admin.leader() is None
    await other.close()


async def _with_job(app: App) -> list[ScheduleRow] | None:
    rows = await app.schedules.list()
    return rows if rows and rows[0].last_job_id is not None else None


async def _gone(app: App, job_id: int) -> bool:
    store = await app.store()
    return await store.get(job_id) is None and (await store.events(job_id)) == []
