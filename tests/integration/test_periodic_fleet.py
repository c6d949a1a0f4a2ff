"""Schedules in a fleet: every worker records its app's schedules and the maintenance
leader fires all of them, whichever kind of worker declared them (two kinds of worker,
a rolling deploy); the newest declaration of a name wins; and every tick up to grace
late is enqueued, so a leader changing hands loses none. Time is a settable clock and
rounds are run_once() calls, so nothing here sleeps or depends on timing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from prometheus_client import REGISTRY

from tests.helpers import fast_config
from tether import App, AppConfig, JobContext, Worker
from tether.config import MaintenanceConfig
from tether.errors import StoreError
from tether.job import Job
from tether.maintenance import Scheduler
from tether.new_job import declarations

Declare = Callable[[App], None]


class Clock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


START = datetime(2026, 3, 2, 12, 0, 0, 300_000, tzinfo=UTC)


def second(n: int) -> datetime:
    """The per-second tick ``n`` seconds after 12:00:00."""
    return START.replace(microsecond=0) + timedelta(seconds=n)


class Fleet:
    """Workers of different apps on one database, driven by hand."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.clock = Clock(START)
        self.apps: list[App] = []
        self.workers: list[Worker] = []

    async def worker(self, declare: Declare) -> Worker:
        # A lease far longer than any test: leadership changes only when a test says so
        # (resign), never because a slow machine let it run out.
        maintenance = MaintenanceConfig(leader_ttl=600.0, leader_renew_interval=1.0)
        app = App(self.url, config=AppConfig(wait_poll_interval=0.05, maintenance=maintenance))
        declare(app)
        self.apps.append(app)
        queues = sorted({"default"} | {t.queue for t in app.tasks.values()})
        worker = Worker(app, fast_config(queues=queues))
        await worker.start(services=False)
        worker.maintenance.scheduler.clock = self.clock
        self.workers.append(worker)
        return worker

    async def round(self) -> list[Job]:
        """One scheduler round on every worker (only the leader fires)."""
        jobs = []
        for w in self.workers:
            jobs.extend(await w.maintenance.scheduler.run_once())
        return jobs

    async def jobs(self) -> list[Job]:
        return sorted(await self.apps[0].jobs.list(limit=10_000), key=lambda j: j.id)

    async def close(self) -> None:
        for w in self.workers:
            await w.stop()
        for app in self.apps:
            await app.close()


@pytest.fixture
async def fleet(db_url: str) -> AsyncIterator[Fleet]:
    f = Fleet(db_url)
    yield f
    await f.close()


def keyed(jobs: list[Job], name: str) -> list[str]:
    return [j.idempotency_key or "" for j in jobs if (j.idempotency_key or "").startswith(name)]


def key(name: str, tick: datetime) -> str:
    return f"schedule:{name}:{tick.isoformat()}"


def reports(app: App) -> None:
    @app.periodic(cron="*/5 * * * *", name="report", args={"kind": "daily"})
    async def report(ctx: JobContext, kind: str) -> str:
        return kind


def billing(app: App) -> None:
    # Another kind of worker: its own task, queue and priority, unknown to `reports`.
    @app.task(queue="billing", priority=7, max_attempts=5)
    async def invoice(ctx: JobContext, n: int) -> int:
        return n

    app.schedules.declare(invoice, cron="*/5 * * * *", name="invoices", args={"n": 2})


async def lead(worker: Worker) -> None:
    assert await worker.maintenance.leader.run_once()


async def test_the_leader_fires_the_schedules_of_another_kind_of_worker(
    fleet: Fleet,
) -> None:
    leader = await fleet.worker(reports)
    other = await fleet.worker(billing)
    await lead(leader)
    assert not await other.maintenance.leader.run_once()
    assert await fleet.round() == []  # both record their schedules; nothing is due
    tick = START.replace(minute=5, microsecond=0)
    fleet.clock.now = tick + timedelta(seconds=1)
    await fleet.round()
    jobs = await fleet.jobs()
    assert keyed(jobs, "schedule:invoices") == [key("invoices", tick)]
    assert keyed(jobs, "schedule:report") == [key("report", tick)]
    [invoice] = [j for j in jobs if j.task.endswith("invoice")]
    # The job is the one the declaring worker's code makes, though the leader has none.
    assert (invoice.queue, invoice.priority, invoice.max_attempts) == ("billing", 7, 5)
    assert invoice.args == {"n": 2}
    assert "invoice" not in " ".join(leader.app.tasks)
    # Each app lists both, and how many live workers declare each.
    rows = {r.name: r for r in await leader.app.schedules.list()}
    assert set(rows) == {"report", "invoices"}
    assert (rows["report"].declared_by, rows["invoices"].declared_by) == (1, 1)
    assert rows["invoices"].defined_by == other.id
    # The declaring worker runs it.
    await other.claimer.run_once()
    assert (await other.app.wait(invoice.id, timeout=10)).result == 2


async def test_a_schedule_added_by_a_rolling_deploy_fires_under_the_old_leader(
    fleet: Fleet,
) -> None:
    old = await fleet.worker(reports)
    await lead(old)
    await fleet.round()

    def newer(app: App) -> None:  # the next release: the same schedule and a new one
        reports(app)
        billing(app)

    fleet.clock.step(60)
    new = await fleet.worker(newer)
    assert not await new.maintenance.leader.run_once()
    await fleet.round()
    tick = START.replace(minute=5, microsecond=0)
    fleet.clock.now = tick + timedelta(seconds=2)
    await fleet.round()
    jobs = await fleet.jobs()
    assert keyed(jobs, "schedule:invoices") == [key("invoices", tick)]
    assert keyed(jobs, "schedule:report") == [key("report", tick)]
    # Once no live worker declares it, it shows, and it goes only when removed.
    await new.stop()
    fleet.workers.remove(new)
    rows = {r.name: r for r in await old.app.schedules.list()}
    assert rows["invoices"].declared_by == 0 and rows["report"].declared_by == 1
    tick = tick.replace(minute=10)
    fleet.clock.now = tick + timedelta(seconds=1)
    await fleet.round()
    assert keyed(await fleet.jobs(), "schedule:invoices")[-1] == key("invoices", tick)
    assert await old.app.schedules.remove("invoices") == 0
    fleet.clock.now = tick.replace(minute=15) + timedelta(seconds=1)
    await fleet.round()
    assert len(keyed(await fleet.jobs(), "schedule:invoices")) == 2
    assert {r.name for r in await old.app.schedules.list()} == {"report"}


def weekly(app: App) -> None:
    @app.periodic(cron="*/10 * * * *", name="report", args={"kind": "weekly"})
    async def report(ctx: JobContext, kind: str) -> str:
        return kind


async def test_the_newest_declaration_of_a_name_wins_with_a_warning(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    first = await fleet.worker(reports)
    await lead(first)
    await fleet.round()
    with caplog.at_level(logging.WARNING, logger="tether.scheduler"):
        second_ = await fleet.worker(weekly)
        await fleet.round()
    [warning] = [r.getMessage() for r in caplog.records if "replaces" in r.getMessage()]
    assert "*/5 * * * *" in warning and "*/10 * * * *" in warning and first.id in warning
    [row] = await first.app.schedules.list()
    assert (row.cron, row.defined_by) == ("*/10 * * * *", second_.id)
    # The leader fires the newest definition, not its own.
    fleet.clock.now = START.replace(minute=5, microsecond=0) + timedelta(seconds=1)
    assert await fleet.round() == []
    fleet.clock.now = START.replace(minute=10, microsecond=0) + timedelta(seconds=1)
    [job] = await fleet.round()
    assert job.args == {"kind": "weekly"}


async def test_concurrent_declarations_of_a_name_leave_one_whole_definition(
    db_url: str,
) -> None:
    apps = []
    for declare in (reports, weekly):
        app = App(db_url)
        declare(app)
        apps.append(app)
    clock = Clock(START)
    schedulers = [
        Scheduler(app, await app.store(), interval=1.0, holder=f"w{i}", clock=clock)
        for i, app in enumerate(apps)
    ]
    try:
        await asyncio.gather(*(s.register() for s in schedulers))
        # A declaration that met the other's uncommitted row tries again next round.
        for s in schedulers:
            await s.run_once()
        [row] = await apps[0].schedules.list()
        winner = next(s for s in schedulers if s.holder == row.defined_by)
        host = winner.app
        limit = host.config.max_payload_bytes
        [mine] = declarations(host.tasks, host.schedules.declared, max_payload_bytes=limit)
        assert row.definition == mine.definition
        assert row.cron == host.schedules.declared["report"].cron
    finally:
        for app in apps:
            await app.close()


def beats(app: App) -> None:
    @app.periodic(cron="* * * * * *", name="beat")  # cronsim's six fields: every second
    async def beat(ctx: JobContext) -> None:
        return None


async def test_a_per_second_schedule_loses_no_tick_through_a_leader_handover(
    fleet: Fleet,
) -> None:
    a = await fleet.worker(beats)
    b = await fleet.worker(beats)
    await lead(a)
    assert not await b.maintenance.leader.run_once()
    await fleet.round()  # at 12:00:00.3
    # A healthy leader whose rounds drift: one tick, then two in one round.
    for step in (1.0, 1.0, 2.0, 0.6, 1.4):
        fleet.clock.step(step)
        await fleet.round()
    # The leader dies; the handover takes 4 s (no scheduler runs meanwhile).
    await a.maintenance.leader.resign()
    fleet.clock.step(4.0)
    await lead(b)
    await fleet.round()
    fleet.clock.step(1.0)
    await fleet.round()
    elapsed = int((fleet.clock.now - START.replace(microsecond=0)).total_seconds())
    assert elapsed == 11
    got = keyed(await fleet.jobs(), "schedule:beat")
    assert got == [key("beat", second(n)) for n in range(1, elapsed + 1)]


async def test_ticks_older_than_grace_are_skipped_and_counted_not_flooded(
    fleet: Fleet,
) -> None:
    def skipped() -> float:
        return REGISTRY.get_sample_value("tether_schedule_ticks_skipped_total") or 0.0

    a = await fleet.worker(beats)
    await lead(a)
    await fleet.round()
    before = skipped()
    fleet.clock.step(3600)  # an hour with no scheduler
    jobs = await fleet.round()
    # The ticks of the last grace (60 s) run; the 3,540 before them are skipped, counted.
    assert len(jobs) == 60 and jobs[0].idempotency_key == key("beat", second(3600 - 59))
    assert skipped() - before == 3600 - 60


@pytest.mark.postgres
async def test_a_held_schedule_row_stalls_neither_declarations_nor_ticks(pg_url: str) -> None:
    fleet = Fleet(pg_url)
    try:
        a = await fleet.worker(beats)
        await lead(a)
        await fleet.round()
        # An operator holds the schedule's row in psql, for as long as they like.
        async with await psycopg.AsyncConnection.connect(pg_url) as holder:
            await holder.execute("SELECT * FROM tether_schedules FOR UPDATE")
            fleet.clock.step(2.0)
            # A new worker with its own definition of the name: recorded later.
            b = await fleet.worker(beats_every_other_second)
            assert await asyncio.wait_for(b.maintenance.scheduler.register(), 5) == ["beat"]
            # The leader's round enqueues the ticks without waiting on the row.
            first = await asyncio.wait_for(a.maintenance.scheduler.run_once(), 5)
            assert keyed(first, "schedule:beat") == [key("beat", second(n)) for n in (1, 2)]
            [row] = await a.app.schedules.list()
            assert row.last_tick == START  # its bookkeeping waits for the next round
            # A person removing it waits a bounded time, then is told why.
            with pytest.raises(StoreError, match="lock timeout"):
                await asyncio.wait_for(a.app.schedules.remove("beat"), 10)
        fleet.clock.step(1.0)
        # The leader looks at ticks 1 and 2 again and gets their jobs back, not new ones;
        # then b records its definition.
        again = await fleet.round()
        assert keyed(again, "schedule:beat") == [key("beat", second(n)) for n in (1, 2, 3)]
        assert [j.id for j in again[:2]] == [j.id for j in first]
        assert len(keyed(await fleet.jobs(), "schedule:beat")) == 3
        [row] = await a.app.schedules.list()
        assert row.last_tick == second(3) and row.defined_by == b.id
    finally:
        await fleet.close()


def beats_every_other_second(app: App) -> None:
    @app.periodic(cron="*/2 * * * * *", name="beat")
    async def beat(ctx: JobContext) -> None:
        return None
