"""The worker process the fault scenarios start, kill, pause and partition.

Run as ``python -m tests.faults.faultapp`` with:

- ``TETHER_FAULT_URL``: the database (for PostgreSQL maybe through the fault proxy);
- ``TETHER_FAULT_DIR``: the run directory (executions are logged under ``exec/``);
- ``TETHER_FAULT_CONFIG``: JSON overrides of the worker settings, and three of the
  app's: ``schedules`` (``[{"name", "cron"}]``: per-second ticks of a ``work`` job,
  declared by this worker's app only), ``retention`` (:class:`~tether.RetentionConfig`)
  and ``hooks`` (``{"fail": p}``: :class:`FlakyHooks` that fail or stall);
- ``TETHER_FAULT_NAME``: the worker's name (kept across restarts);
- ``TETHER_FAULT_PROC``: this incarnation's key (``name#n``), the same in every PID
  namespace; its execution log is ``exec/exec-<key>.log`` and its worker id is written
  to ``exec/worker-<key>.id`` before it registers.

Every attempt appends a JSON line to its process's execution log when it starts (job,
attempt, lease token, pid, process key, time), and another when it tries its side
effect and when it ends. The side effect is the fenced write of :mod:`tests.faults.effects`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sqlite3
import sys
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg

import tether
from tests.faults import effects
from tether import App, JobState, LeaseLostError, RetentionConfig, Worker, WorkerConfig
from tether.config import LoopBackoff
from tether.hooks import Hooks
from tether.store.postgres import URL_SETTINGS

# Worker settings for every scenario: a 3 s lease renewed every 0.5 s; dead processes
# and expired leases are looked for four times a second.
BASE_CONFIG: dict[str, Any] = {
    "concurrency": 4,
    "claim_batch": 4,
    "poll_interval": 0.5,
    "heartbeat_interval": 0.5,
    "lease_duration": 3.0,
    "self_fence_margin": 0.75,
    "rescue_interval": 0.25,
    "dead_session_grace": 2.5,
    "stop_timeout": 2.0,
    "cancel_grace": 0.3,
    "cancel_timeout": 1.0,
    "kill_timeout": 1.0,
    "backoff": LoopBackoff(after_errors=3, ceiling=2.0),
}
SPIN_LIMIT = 120.0  # a CPU loop that nobody stops still ends by itself
# Tasks that run the body of ``work`` (a fenced effect each): plain, rate-limited (the
# scenarios set the limit), and holding a slot of the resource pool ``pool``.
WORK_TASKS = ("work", "paced", "pooled")
POOL_CAPACITY = 2


def _proc() -> str:
    """This worker incarnation's key (pids repeat across PID namespaces)."""
    return os.environ.get("TETHER_FAULT_PROC") or str(os.getpid())


def _exec_dir() -> str:
    return os.path.join(os.environ.get("TETHER_FAULT_DIR", "."), "exec")


def _log_path() -> str:
    return os.path.join(_exec_dir(), f"exec-{_proc()}.log")


def record(**fields: Any) -> None:
    """Append one line to this process's execution log (one write: atomic)."""
    line = json.dumps({**fields, "pid": os.getpid(), "proc": _proc(), "t": time.time()}) + "\n"
    fd = os.open(_log_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Effects:
    """This process's fenced writes (one connection, reopened after any error)."""

    def __init__(self, url: str) -> None:
        # psycopg refuses tether's own URL parameters (``?pgbouncer=true&listen_url=``):
        # the effect goes where the worker's store goes, without them, and never
        # prepares a statement (a pooler in transaction mode does not keep them).
        self.url = url
        if not url.startswith("sqlite"):
            parts = urlsplit(url)
            query = [(k, v) for k, v in parse_qsl(parts.query) if k not in URL_SETTINGS]
            self.url = urlunsplit(parts._replace(query=urlencode(query)))
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.lock = asyncio.Lock()

    async def write(self, ctx: tether.JobContext) -> bool:
        job, token, attempt = ctx.id, ctx.job.lease_token, ctx.attempt
        record(ev="effect_try", job=job, token=token)
        if self.url.startswith("sqlite"):
            path = effects.sqlite_path(self.url)
            ok = await asyncio.to_thread(
                effects.sqlite_effect, path, job, token, attempt, os.getpid()
            )
        else:
            ok = await self._pg(job, token, attempt)
        record(ev="effect", job=job, token=token, ok=ok)
        return ok

    async def _pg(self, job: int, token: int, attempt: int) -> bool:
        async with self.lock:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = await psycopg.AsyncConnection.connect(
                        self.url, autocommit=True, connect_timeout=5, prepare_threshold=None
                    )
                conn = self.conn
                params = {"job": job, "token": token, "attempt": attempt, "pid": os.getpid()}
                call = asyncio.ensure_future(self._effect(conn, params))
                try:
                    return await asyncio.shield(call)
                except asyncio.CancelledError:
                    # psycopg answers a cancelled call by asking the server to cancel it
                    # and waiting for that (up to 10 s), which a host cut off never gets:
                    # shut the socket down under it, so a job told to stop stops now.
                    _sever(conn)
                    with contextlib.suppress(BaseException):
                        await call
                    raise
            except BaseException:
                conn, self.conn = self.conn, None
                if conn is not None:
                    with contextlib.suppress(BaseException):
                        await asyncio.wait_for(conn.close(), 1.0)
                raise

    @staticmethod
    async def _effect(conn: psycopg.AsyncConnection[Any], params: dict[str, Any]) -> bool:
        cur = await conn.execute(effects.PG_EFFECT, params)
        row = await cur.fetchone()
        return bool(row and row[0])


def _sever(conn: psycopg.AsyncConnection[Any]) -> None:
    """Shut a connection's socket down: a call waiting on it fails at once."""
    with contextlib.suppress(Exception), socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _url() -> str:
    return os.environ.get("TETHER_FAULT_URL", "sqlite:///fault.db")


# Process-executor handlers are module-level functions, so the child can import them.
def spin(ctx: Any, seconds: float = SPIN_LIMIT) -> str:
    """A CPU loop that never checks for cancellation (process executor)."""
    record(ev="start", job=ctx.id, attempt=ctx.attempt, token=-1, task="spin")
    deadline = time.monotonic() + min(seconds, SPIN_LIMIT)
    n = 0
    while time.monotonic() < deadline:
        n += 1
    return "spun"


def block(ctx: Any, seconds: float = 5.0) -> str:
    """A blocking call that never checks for cancellation (thread executor), then the
    fenced effect: once the job was abandoned, the effect must be refused."""
    job = ctx.job
    record(ev="start", job=job.id, attempt=job.attempt, token=job.lease_token, task="block")
    time.sleep(seconds)
    url = _url()
    record(ev="effect_try", job=job.id, token=job.lease_token)
    if url.startswith("sqlite"):
        ok = effects.sqlite_effect(
            effects.sqlite_path(url), job.id, job.lease_token, job.attempt, os.getpid()
        )
    else:
        ok = effects.pg_effect_sync(url, job.id, job.lease_token, job.attempt, os.getpid())
    record(ev="effect", job=job.id, token=job.lease_token, ok=ok)
    record(ev="end", job=job.id, token=job.lease_token, how="returned" if ok else "fenced")
    return "woke"


def retried_marker(job: int, run_dir: str | os.PathLike[str] | None = None) -> str:
    """The file a scenario creates before it retries a parent that failed on purpose."""
    exec_dir = _exec_dir() if run_dir is None else os.path.join(run_dir, "exec")
    return os.path.join(exec_dir, f"retried-{job}")


def build_app(url: str) -> App:
    """The app the workers run (the test process enqueues through its own copy)."""
    app = App(url)
    app.resource("pool", capacity=POOL_CAPACITY)
    eff = Effects(url)

    async def _run(ctx: tether.JobContext, task: str, body: Any) -> Any:
        record(
            ev="start",
            job=ctx.id,
            attempt=ctx.attempt,
            token=ctx.job.lease_token,
            task=task,
            ckpt=ctx.checkpoint,
            phase=ctx.phase,
        )
        how = "error"

        async def watch() -> None:
            # When the worker tells the job to stop, even while it waits on the database.
            await ctx.cancelled.wait()
            record(ev="stop", job=ctx.id, token=ctx.job.lease_token, why=ctx.cancelled.reason)

        watcher = asyncio.ensure_future(watch())
        try:
            out = await body()
            how = "returned"
            return out
        except asyncio.CancelledError:
            how = "cancelled"
            raise
        except LeaseLostError:
            how = "fenced"
            raise
        finally:
            watcher.cancel()
            record(ev="end", job=ctx.id, token=ctx.job.lease_token, how=how)

    def work_task(name: str, resources: tuple[str, ...] = ()) -> None:
        @app.task(name=name, max_attempts=10, resources=resources)
        async def work(ctx: tether.JobContext, ms: int = 100, effect: bool = True) -> int:
            """Works ``ms`` milliseconds of monotonic time (looking for a stop request
            every 50 ms), then writes its effect."""

            async def body() -> int:
                deadline = time.monotonic() + ms / 1000
                while (left := deadline - time.monotonic()) > 0:
                    ctx.check_cancelled()  # a well-behaved handler: stops when asked
                    await asyncio.sleep(min(0.05, left))
                if effect and not await eff.write(ctx):
                    raise LeaseLostError(f"job {ctx.id}: effect refused (stale lease)")
                return ms

            return int(await _run(ctx, name, body))

    work_task("work")
    work_task("paced")
    work_task("pooled", resources=("pool",))

    @app.task(name="parent", max_attempts=10)
    async def parent(
        ctx: tether.JobContext, children: int = 3, child_ms: int = 50, fail_fanin: bool = False
    ) -> int:
        """Fans out ``children`` work jobs and waits for them (holding no worker); its
        fan-in counts them. With ``fail_fanin`` the fan-in fails for good (``Fail``)
        until the scenario marks the job retried (:func:`retried_marker`)."""

        async def body() -> int:
            if ctx.phase is None:
                for _ in range(children):
                    await ctx.spawn("work", ms=child_ms)
                record(ev="spawned", job=ctx.id, token=ctx.job.lease_token, n=children)
                raise tether.WaitForChildren(phase="fanin")
            kids = await ctx.children()
            ok = sum(1 for k in kids if k.state is JobState.SUCCEEDED)
            record(ev="fanin", job=ctx.id, token=ctx.job.lease_token, seen=len(kids), ok=ok)
            retried = await asyncio.to_thread(os.path.exists, retried_marker(ctx.id))
            if fail_fanin and not retried:
                raise tether.Fail("the fan-in fails on purpose")
            return ok

        return int(await _run(ctx, "parent", body))

    @app.task(name="long", max_attempts=10)
    async def long(ctx: tether.JobContext, steps: int = 20, step_ms: int = 200) -> int:
        """Checkpoints after every step; a new attempt resumes from the checkpoint."""

        async def body() -> int:
            start = int((ctx.checkpoint or {}).get("step", 0))  # type: ignore[union-attr]
            for step in range(start, steps):
                await asyncio.sleep(step_ms / 1000)
                await ctx.save_checkpoint({"step": step + 1})
            if not await eff.write(ctx):
                raise LeaseLostError(f"job {ctx.id}: effect refused (stale lease)")
            return start

        return int(await _run(ctx, "long", body))

    @app.task(name="durable", max_attempts=10)
    async def durable(
        ctx: tether.JobContext, steps: int = 5, ms: int = 100, hold: bool = True
    ) -> list[int]:
        """Runs ``steps`` durable steps of ``ms`` milliseconds each; each step inserts
        its row into ``fault_step_effects`` in a fenced transaction, committed with the
        step's record. With ``hold`` the transaction stays open while the step works
        (PostgreSQL: a worker frozen mid-step is frozen with its write uncommitted);
        without, it opens at the step's end (SQLite: it holds the write lock).

        Logs ``step_start`` when a step's function runs, ``step_write`` once its row is
        written (uncommitted), ``step_done`` when the step returned from its function
        (committed), ``step_replay`` when it returned a recorded result instead."""

        async def work(seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                ctx.check_cancelled()
                await asyncio.sleep(min(0.05, left))

        async def run_step(name: str, i: int) -> int:
            token = ctx.job.lease_token
            record(ev="step_start", job=ctx.id, attempt=ctx.attempt, token=token, step=name)
            if not hold:
                await work(ms / 1000)
            row = (ctx.id, name, ctx.attempt, token, os.getpid(), time.time())
            async with ctx.transaction() as conn:
                if isinstance(conn, sqlite3.Connection):
                    conn.execute(
                        "INSERT INTO fault_step_effects (job_id, step, attempt, lease_token, "
                        "pid, at) VALUES (?, ?, ?, ?, ?, ?)",
                        row,
                    )
                else:
                    await conn.execute(
                        "INSERT INTO fault_step_effects (job_id, step, attempt, lease_token, "
                        "pid, at) VALUES (%s, %s, %s, %s, %s, %s)",
                        row,
                    )
                record(ev="step_write", job=ctx.id, token=token, step=name)
                if hold:
                    await work(ms / 1000)
            return i

        async def body() -> list[int]:
            out = []
            for i in range(steps):
                name = f"s{i}"
                ran: list[bool] = []

                async def fn(name: str = name, i: int = i, ran: list[bool] = ran) -> int:
                    ran.append(True)
                    return await run_step(name, i)

                out.append(int(await ctx.step(name, fn)))
                ev = "step_done" if ran else "step_replay"
                record(ev=ev, job=ctx.id, attempt=ctx.attempt, token=ctx.job.lease_token, step=name)
            return out

        return list(await _run(ctx, "durable", body))

    @app.task(name="poison", max_attempts=3)
    async def poison(ctx: tether.JobContext) -> None:
        """Kills its own worker process on every attempt."""
        record(
            ev="start", job=ctx.id, attempt=ctx.attempt, token=ctx.job.lease_token, task="poison"
        )
        record(ev="end", job=ctx.id, token=ctx.job.lease_token, how="killed its worker")
        record(ev="exit")  # the process ends here: no later line of it runs
        os.kill(os.getpid(), signal.SIGKILL)

    app.task(name="spin", executor="process", max_attempts=1)(spin)
    app.task(name="block", executor="thread", max_attempts=1)(block)
    return app


def _note_worker_id(worker_id: str) -> None:
    """Tell the harness who we are: pids repeat across PID namespaces, worker ids do not."""
    with open(os.path.join(_exec_dir(), f"worker-{_proc()}.id"), "w") as f:
        f.write(worker_id)


class WorkerEvents(logging.Handler):
    """Copies two moments of the worker's own log into the execution log: when it
    handled a stop signal (``worker_stop``) and when it launched a job (``launch``), so the
    harness can tell a job launched before the stop from one launched after it."""

    def emit(self, log_record: logging.LogRecord) -> None:
        if log_record.getMessage().startswith("stopping: no new claims"):
            record(ev="worker_stop")
        elif getattr(log_record, "event", None) == "job_started":
            job = getattr(log_record, "job_id", None)
            record(ev="launch", job=job, attempt=getattr(log_record, "attempt", None))


class FlakyHooks(tether.Hook):
    """Hooks that fail: each call raises (before or after calling on) or, for an
    outcome, stalls, with probability ``fail``; seeded per process. What a hook did is
    logged (``ev="hook"``), so a scenario can count it."""

    def __init__(self, fail: float, stall_s: float = 5.0) -> None:
        import random

        self.rng = random.Random(f"{_proc()}:{os.getpid()}")
        self.fail = fail
        self.stall_s = stall_s

    def _roll(self, phase: str, job: int | None) -> str | None:
        r = self.rng.random()
        if r >= self.fail:
            return None
        how = "before" if r < self.fail / 2 else "after"
        record(ev="hook", phase=phase, how=how, job=job)
        return how

    async def enqueue(self, jobs: Any, call_next: Any) -> Any:
        how = self._roll("enqueue", None)
        if how == "before":
            raise RuntimeError("flaky enqueue hook (before)")
        made = await call_next()
        if how == "after":
            raise RuntimeError("flaky enqueue hook (after)")
        return made

    async def execute(self, ctx: tether.JobContext, call_next: Any) -> Any:
        how = self._roll("execute", ctx.id)
        if how == "before":
            raise RuntimeError("flaky execute hook (before)")
        value = await call_next()
        if how == "after":
            raise RuntimeError("flaky execute hook (after)")
        return value

    async def outcome(self, event: tether.OutcomeEvent) -> None:
        how = self._roll("outcome", event.job.id)
        if how == "before":
            raise RuntimeError("flaky outcome hook")
        if how == "after":
            await asyncio.sleep(self.stall_s)  # a stalled reporter (a slow tracker)


async def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.INFO)  # the worker's DEBUG lines go to WorkerEvents only
    worker_log = logging.getLogger("tether.worker")
    worker_log.setLevel(logging.DEBUG)
    worker_log.addHandler(WorkerEvents(logging.DEBUG))
    os.makedirs(os.path.dirname(_log_path()), exist_ok=True)
    app = build_app(_url())
    settings = {**BASE_CONFIG, **json.loads(os.environ.get("TETHER_FAULT_CONFIG", "{}"))}
    for sched in settings.pop("schedules", ()):
        app.schedules.declare("work", cron=sched["cron"], name=sched["name"], args={"ms": 10})
    if (retention := settings.pop("retention", None)) is not None:
        app.config = dataclasses.replace(app.config, retention=RetentionConfig(**retention))
    if (hooks := settings.pop("hooks", None)) is not None:
        app.hooks = Hooks([FlakyHooks(**hooks)])
    if "queues" in settings:
        settings["queues"] = tuple(settings["queues"])
    name = os.environ.get("TETHER_FAULT_NAME")
    worker = Worker(app, WorkerConfig(**settings, name=name))
    _note_worker_id(worker.id)
    await worker.run(handle_signals=True)


if __name__ == "__main__":
    asyncio.run(main())
