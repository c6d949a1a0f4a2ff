"""A worker process for crash and multi-process tests.

Run as ``python -m tests.integration.procapp`` with ``TETHER_DATABASE_URL`` and
``TETHER_EXEC_LOG`` (a directory) set. Every attempt appends one line to its process's
execution log before doing anything: ``job attempt lease_token pid``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import sys
import time

import tether
from tests.helpers import fast_config
from tether import App, Worker


def build_app(url: str) -> App:
    """The app every process of a test shares."""
    app = App(url)
    log_dir = os.environ.get("TETHER_EXEC_LOG", ".")

    def record(ctx: tether.JobContext) -> None:
        line = f"{ctx.id} {ctx.attempt} {ctx.job.lease_token} {os.getpid()}\n"
        fd = os.open(
            os.path.join(log_dir, f"exec-{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
        )
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    @app.task(name="noop", max_attempts=3)
    async def noop(ctx: tether.JobContext, n: int = 0) -> int:
        record(ctx)
        return n

    @app.task(name="sleepy", max_attempts=3)
    async def sleepy(ctx: tether.JobContext, seconds: float = 1.0) -> float:
        """Runs for ``seconds``: long enough to need its lease extended."""
        record(ctx)
        await asyncio.sleep(seconds)
        return seconds

    @app.task(name="hang_once", max_attempts=3)
    async def hang_once(ctx: tether.JobContext) -> int:
        """Hangs on its first attempt (until killed); returns on the next."""
        record(ctx)
        if ctx.attempt == 1:
            await asyncio.sleep(3600)
        return ctx.attempt

    @app.task(name="checkpoint_on_stop", max_attempts=1)
    async def checkpoint_on_stop(ctx: tether.JobContext) -> object:
        """Waits for the worker's stop, saves a checkpoint and steps aside; the next
        attempt returns what it resumed from."""
        record(ctx)
        if ctx.checkpoint is not None:
            return {"resumed_from": ctx.checkpoint, "attempt": ctx.attempt}
        await ctx.stopping.wait()
        await ctx.save_checkpoint({"saved": "after SIGTERM", "cancelled": bool(ctx.cancelled)})
        ctx.check_stopping()
        return None

    def log_step(ctx: tether.JobContext, step: str) -> None:
        """One line per step run: ``job attempt step pid`` (steps-<pid>.log)."""
        line = f"{ctx.id} {ctx.attempt} {step} {os.getpid()}\n"
        fd = os.open(
            os.path.join(log_dir, f"steps-{os.getpid()}.log"),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        )
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    @app.task(name="six_steps", max_attempts=3)
    async def six_steps(ctx: tether.JobContext) -> list[int]:
        """Six durable steps; the first attempt hangs after the third (and is killed)."""
        record(ctx)
        out = []
        for i in range(1, 7):

            async def work(i: int = i) -> int:
                log_step(ctx, f"s{i}")
                return i

            out.append(int(await ctx.step(f"s{i}", work)))
            if i == 3 and ctx.attempt == 1:
                await asyncio.sleep(3600)
        return out

    @app.task(name="zombie_effect", max_attempts=3)
    async def zombie_effect(ctx: tether.JobContext) -> int:
        """A step with a fenced write; the first attempt logs ``frozen`` and pauses for
        the test to stop the process: on PostgreSQL inside the open transaction, after
        its write; on SQLite before it (its transaction would hold the file's write lock
        and stall everyone else meanwhile)."""
        record(ctx)
        inside = not app.url.startswith("sqlite")

        async def effect() -> int:
            if ctx.attempt == 1 and not inside:
                log_step(ctx, "frozen")
                await asyncio.sleep(3.0)
            async with ctx.transaction() as conn:
                sql = "INSERT INTO ledger (job_id, attempt) VALUES (%s, %s)"
                if inside:
                    await conn.execute(sql, (ctx.id, ctx.attempt))
                else:
                    conn.execute(sql.replace("%s", "?"), (ctx.id, ctx.attempt))
            if ctx.attempt == 1 and inside:
                log_step(ctx, "frozen")
                await asyncio.sleep(3.0)
            log_step(ctx, "effect")
            return ctx.attempt

        try:
            return int(await ctx.step("effect", effect))
        finally:
            log_step(ctx, "over")  # however the attempt ends: committed, refused, stopped

    return app


async def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app = build_app(os.environ["TETHER_DATABASE_URL"])
    concurrency = int(os.environ.get("TETHER_CONCURRENCY", "4"))
    worker = Worker(app, fast_config(concurrency=concurrency, claim_batch=concurrency))
    await worker.run(handle_signals=True)


def _sleep_without_clock_nanosleep(seconds: float) -> None:
    """``time.sleep`` by ``select``: under libfaketime 0.9.10 with the monotonic clock
    left real (FAKETIME_DONT_FAKE_MONOTONIC), every ``clock_nanosleep``, which
    ``time.sleep`` calls, fails with EINVAL; the clock-step tests run workers there."""
    select.select([], [], [], max(0.0, seconds))


if __name__ == "__main__":
    if "faketime" in os.environ.get("LD_PRELOAD", ""):
        time.sleep = _sleep_without_clock_nanosleep
    asyncio.run(main())
