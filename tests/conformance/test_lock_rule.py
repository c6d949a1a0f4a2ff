"""The rule: no heartbeat, rescue, finish, follow-up, prune, schedule or leader statement
waits on a row lock without a bound.

Any client may hold any row for as long as it likes. Every statement these duties send
must therefore either skip held rows (``SKIP LOCKED``) or refuse them (``NOWAIT``), or
run with the store's bound on lock waits (``Service.lock_wait``, applied by PostgreSQL
as ``SET LOCAL lock_timeout``; the duty handles the resulting ``RowLocked``).

Two checks, PostgreSQL only (SQLite has no row locks):

- static: each duty's round runs once on real data, every statement it sends through
  the store's transaction is recorded with the bound in force, and each is checked;
- dynamic: every row of the tables these duties touch is held from a second
  connection, in each lock mode, and each duty's round must return (or give up with
  ``RowLocked``) promptly instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import pkgutil
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest

import tether
from tests.helpers import fast_config
from tether import App, AppConfig, JobState, Worker
from tether.config import RetentionConfig
from tether.errors import RowLocked
from tether.joblog import PendingLine
from tether.service import Service
from tether.store.driver import LOCK_WAIT
from tether.store.postgres_tx import PostgresTx
from tether.worker.completer import Completer

pytestmark = pytest.mark.postgres

DUTIES = ("heartbeat", "finish", "rescue", "leader", "follow-up", "prune", "schedule")
MODES = ("FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE")
# The tables the duties read and write.
TABLES = {
    "tether_jobs": "id",
    "tether_workers": "id",
    "tether_leaders": "name",
    "tether_schedules": "name",
    "tether_cancellations": "id",
    "tether_limits": "name",
}
BOUNDS = {"max_lines": 10, "max_bytes": 1000}
PROMPT = 5.0  # generous: the bound on lock waits is 1 s; a wait would hang up to 30 s

_WRITE = re.compile(r"\b(?:UPDATE\s+tether_\w+|DELETE\s+FROM|INSERT\s+INTO)\b")


def _strip(sql: str) -> str:
    no_comments = re.sub(r"--[^\n]*", "", sql)
    return re.sub(r"\s+", " ", no_comments).strip().upper().replace("TETHER_", "tether_")


def unbounded_waits(sql: str) -> list[str]:
    """Why ``sql``, run without a bound on lock waits, could wait on a row lock: a
    locking clause that neither skips nor refuses held rows, or more writes than
    skipping locks (a write to rows it did not first lock, skipping the held ones)."""
    text = _strip(sql)
    why = []
    locks = [
        m.group(0)
        for m in re.finditer(
            r"\bFOR (?:NO KEY UPDATE|UPDATE|KEY SHARE|SHARE)"
            r"(?: OF [\w, ]+?)?(?: SKIP LOCKED| NOWAIT)?\b",
            text,
        )
    ]
    skipping = [lock for lock in locks if lock.endswith(("SKIP LOCKED", "NOWAIT"))]
    why += [f"waits: {lock}" for lock in locks if lock not in skipping]
    writes = _WRITE.findall(text)
    if len(writes) > len(skipping):
        why.append(f"{len(writes)} write(s) but {len(skipping)} skipping lock(s)")
    return why


def test_the_rule_flags_statements_that_wait() -> None:
    assert unbounded_waits("SELECT 1 FROM tether_jobs") == []
    assert unbounded_waits("SELECT id FROM tether_jobs FOR UPDATE") != []
    assert unbounded_waits("SELECT id FROM tether_jobs FOR UPDATE SKIP LOCKED") == []
    assert unbounded_waits("SELECT id FROM tether_jobs FOR SHARE NOWAIT") == []
    assert unbounded_waits("UPDATE tether_jobs SET a = 1 WHERE id = 1") != []
    assert (
        unbounded_waits(
            "UPDATE tether_jobs SET a = 1 WHERE id IN (SELECT id FROM tether_jobs "
            "FOR NO KEY UPDATE SKIP LOCKED)"
        )
        == []
    )
    assert (
        unbounded_waits("INSERT INTO tether_leaders VALUES (1) ON CONFLICT DO UPDATE SET a=1") != []
    )


# The named statements that wait on a row lock someone may hold, each with what bounds
# the wait. Every other locking clause in the PostgreSQL SQL skips or refuses held rows.
WAITING = {
    # A key-share lock waits only on a full update lock (a person's delete, psql); an
    # enqueue is its caller's own statement, under the caller's deadline.
    "enqueue.DEPENDENCY_STATES": "the caller's deadline",
    # Both must see the row's latest version; SqlBase._transact_bounded gives up with
    # RowLocked after ROW_LOCK_WAIT (test_a_held_job_row_bounds_spawn_artifact_delete).
    "enqueue.DELETING": "SqlBase._transact_bounded",
    "leases.LEASE_HELD": "SqlBase._transact_bounded",
    # A sleep or a wait and a signal take the job's row in turn, so that no wake-up is
    # lost (tether.store.common.steps); a fenced transaction's lease check holds it to
    # its commit. Each under SqlBase._transact_bounded (the test below).
    "steps.LOCK_OWN_JOB": "SqlBase._transact_bounded",
    "steps.LOCK_JOB": "SqlBase._transact_bounded",
    "steps.FENCE": "SqlBase._transact_bounded",
}


def _named_statements() -> Iterator[tuple[str, str]]:
    import tether.store.sql.postgres as dialect

    for info in pkgutil.iter_modules(dialect.__path__):
        module = importlib.import_module(f"{dialect.__name__}.{info.name}")
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, str):
                yield f"{info.name}.{name}", value


def test_every_named_statement_that_waits_on_a_row_lock_says_what_bounds_it() -> None:
    waiting = {
        name
        for name, sql in _named_statements()
        if any(why.startswith("waits:") for why in unbounded_waits(sql))
    }
    assert waiting == set(WAITING), (
        f"new waits: {sorted(waiting - set(WAITING))}; gone: {sorted(set(WAITING) - waiting)}"
    )


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[str, float | None]]]:
    """Every statement sent through PostgreSQL's transaction, with the lock bound."""
    sent: list[tuple[str, float | None]] = []
    originals = {name: getattr(PostgresTx, name) for name in ("all", "one", "tuples", "run")}

    def spy(name: str) -> Callable[..., Awaitable[Any]]:
        original = originals[name]

        async def call(self: PostgresTx, query: str, params: Any = None) -> Any:
            sent.append((query, LOCK_WAIT.get()))
            return await original(self, query, params)

        return call

    for name in originals:
        setattr(PostgresTx, name, spy(name))
    try:
        yield sent
    finally:
        for name, original in originals.items():
            setattr(PostgresTx, name, original)


class Fleet:
    """A real worker whose every duty has work to do, and how to run each duty once."""

    def __init__(self, app: App, worker: Worker, task: str) -> None:
        self.app = app
        self.worker = worker
        self.task = task
        # A completer of our own: the worker's runs by itself, even with services off.
        # It writes the finishing jobs' log lines first, with the worker's logbook.
        self.completer = Completer(worker.store, worker.id, logbook=worker.logbook)

    async def round(self, duty: str) -> None:
        w = self.worker
        services: dict[str, Service] = {
            "heartbeat": w.heartbeater,
            "finish": self.completer,
            "rescue": w.maintenance.rescuer,
            "leader": w.maintenance.leader,
            "follow-up": w.maintenance.follow_up,
            "prune": w.maintenance.pruner,
            "schedule": w.maintenance.scheduler,
        }
        await services[duty].round()

    async def prepare(self) -> None:
        """What the next round of each duty needs: an outcome for the completer (a job
        this worker holds, handed back, with a log line to write first)."""
        [job] = await self.worker.store.claim(self.worker.id, ["default"], [self.task], 1, 60)
        self.worker.logbook.add(job.id, job.lease_token, PendingLine(0.0, "info", "a line"))
        self.completer.submit(_released(job))


def _released(job: tether.Job) -> Any:
    from tether.job import Outcome

    return Outcome(job_id=job.id, lease_token=job.lease_token, state=JobState.QUEUED)


@contextlib.asynccontextmanager
async def fleet(pg_url: str) -> AsyncIterator[Fleet]:
    app = App(
        pg_url,
        config=AppConfig(
            wait_poll_interval=0.05,
            cancellation_adopt_after=0.0,
            retention=RetentionConfig(succeeded=1.0),
        ),
    )
    release = asyncio.Event()

    @app.task
    async def slow(ctx: tether.JobContext) -> None:
        await release.wait()

    @app.periodic(cron="* * * * * *", name="tick")
    async def tick(ctx: tether.JobContext) -> None:
        pass

    worker = Worker(app, fast_config(lease_duration=60, rescue_interval=60))
    await worker.start(services=False)
    store = worker.store
    try:
        await worker.maintenance.leader.run_once()
        await worker.maintenance.scheduler.run_once()  # the schedule's row
        # Work for each duty: a running job to beat for, jobs to hand back, a dead
        # worker's job to rescue, an old finished job to prune, a partial cancellation.
        for _ in range(12):
            await slow.enqueue()
        beating = await store.claim(worker.id, ["default"], [slow.name], 1, 60)
        worker.launch(beating[0])
        await store.register_worker("w-dead", None, "h", 1, None, ["default"], 1)
        await store.claim("w-dead", ["default"], [slow.name], 1, 60)
        await store.set_worker_state("w-dead", "dead")
        [claimed] = await store.claim("w-other", ["default"], [slow.name], 1, 60)
        from tether.job import Outcome

        await store.finish(
            "w-other", [Outcome(claimed.id, claimed.lease_token, JobState.SUCCEEDED)]
        )
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE tether_jobs SET finished_at = now() - interval '1 hour' WHERE id = %s",
                (claimed.id,),
            )
        await app.cancel(beating[0].id, wait=0)
        yield Fleet(app, worker, slow.name)
    finally:
        release.set()
        await worker.stop()
        await app.close()


async def test_no_duty_statement_waits_on_a_row_lock_without_a_bound(pg_url: str) -> None:
    async with fleet(pg_url) as f:
        found: dict[str, list[str]] = {}
        await f.prepare()
        for duty in DUTIES:
            with recording() as sent:
                await f.round(duty)
            assert sent, f"{duty}: sent no statement (nothing exercised)"
            for sql, bound in sent:
                if bound is not None:
                    continue  # runs under SET LOCAL lock_timeout
                why = unbounded_waits(sql)
                if why:
                    found.setdefault(duty, []).append(f"{why}: {_strip(sql)[:300]}")
        assert found == {}


async def _hold_everything(url: str, mode: str) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(url)
    for table in TABLES:
        await conn.execute(f"SELECT 1 FROM {table} {mode}")
    return conn


@pytest.mark.parametrize("mode", MODES)
async def test_every_duty_returns_promptly_while_all_its_rows_are_held(
    pg_url: str, mode: str
) -> None:
    async with fleet(pg_url) as f:
        await f.prepare()
        holder = await _hold_everything(pg_url, mode)
        slow: dict[str, str] = {}
        try:
            for duty in DUTIES:
                try:
                    await asyncio.wait_for(f.round(duty), PROMPT)
                except RowLocked:
                    pass  # bounded, and handled by the service's loop: next round
                except TimeoutError:
                    slow[duty] = f"still waiting after {PROMPT}s"
        finally:
            await holder.rollback()
            await holder.close()
        assert slow == {}


async def test_a_held_job_row_bounds_spawn_artifact_delete(pg_url: str) -> None:
    # The writes that must wait on a job's row (WAITING) give up with RowLocked while
    # another client holds it, and go through once it is free.
    from tests.conformance.support import new_job, running_job
    from tether.joblog import PendingLine
    from tether.store import create_store
    from tether.store.driver import ROW_LOCK_WAIT, lock_wait

    store = create_store(pg_url)
    await store.open()
    try:
        await store.migrate()
        job = await running_job(store, "w1")
        line = PendingLine(0.0, "info", "held, then written")
        with psycopg.connect(pg_url) as holder:
            holder.execute("SELECT 1 FROM tether_jobs WHERE id = %s FOR UPDATE", (job.id,))
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(RowLocked):  # the default bound
                await asyncio.wait_for(store.delete(job.id, "op"), PROMPT + ROW_LOCK_WAIT)
            assert loop.time() - started < PROMPT
            with lock_wait(0.2):
                with pytest.raises(RowLocked):
                    await store.spawn(job.id, job.lease_token, new_job("child", "q"))
                with pytest.raises(RowLocked):
                    await store.save_artifact(job.id, job.lease_token, "a", b"x")
                with pytest.raises(RowLocked):
                    await store.save_step(job.id, job.lease_token, "s", "1")
                with pytest.raises(RowLocked):
                    await store.fence(job.id, job.lease_token)
                with pytest.raises(RowLocked):
                    await store.append_logs(job.id, job.lease_token, [line], **BOUNDS)
                with pytest.raises(RowLocked):
                    await store.signal(job.id, "go", "1")
                with pytest.raises(RowLocked):
                    await store.wait(
                        "w1", job.id, job.lease_token, "sleep:1", seconds=9, reason="r"
                    )
            holder.rollback()
        assert await store.spawn(job.id, job.lease_token, new_job("child", "q")) is not None
        assert await store.save_artifact(job.id, job.lease_token, "a", b"x")
        assert await store.save_step(job.id, job.lease_token, "s", "1")
        assert await store.fence(job.id, job.lease_token)
        assert await store.append_logs(job.id, job.lease_token, [line], **BOUNDS)
        assert [x.message for x in await store.logs(job.id)] == ["held, then written"]
        assert await store.signal(job.id, "go", "1") == "kept"
        parked = await store.wait("w1", job.id, job.lease_token, "sleep:1", seconds=9, reason="r")
        assert parked.outcome == "parked"
    finally:
        await store.close()
