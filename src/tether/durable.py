"""Durable steps, sleeps, waits for signals and fenced effects, as a handler uses them.

A job's attempts share what its earlier attempts completed: ``ctx.step(name, fn)`` runs
``fn`` once per job and stores its JSON result under the job's lease; a later attempt
(a retry, a rescue, a resume, a restart after a crash) gets the stored result without
running ``fn`` again. Code outside steps runs again on every attempt.

``ctx.sleep()`` and ``ctx.wait_for()`` park the job: it gives back its lease and its
worker slot, spends no attempt, and runs again (on any worker) when it wakes, replaying
the handler past its completed steps. ``ctx.transaction()`` gives the handler a
connection to tether's own database in a transaction that commits only while the
attempt holds the lease, together with the step it runs in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from tether import metrics, payload
from tether.errors import (
    Cancelled,
    DuplicateStepError,
    InvalidJobError,
    LeaseLostError,
    PayloadTooLargeError,
    SignalTimeoutError,
)
from tether.job import JSON, Job, StepInfo
from tether.store.common.steps import signal_step
from tether.store.protocols import StepStore

MAX_NAME = 200
"""The longest step or signal name."""


class Parked(BaseException):
    """The job was parked by a sleep or a wait: the attempt ends here, and its job,
    already back in ``queued``, holds no lease. Internal: the worker records nothing.

    A ``BaseException``, so that a handler's ``except Exception`` does not swallow it."""


def check_name(name: str, what: str = "step") -> str:
    """``name`` if it can name a step or a signal, else a clear :class:`InvalidJobError`."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidJobError(f"a {what} needs a name")
    if len(name) > MAX_NAME or not name.isprintable():
        raise InvalidJobError(
            f"a {what} name must be 1 to {MAX_NAME} printable characters: {name[:40]!r}"
        )
    return name


@dataclasses.dataclass
class _Frame:
    """The step running in this context, and the fenced transaction it opened."""

    name: str
    fenced: FencedConnection | None = None


_STEP: ContextVar[_Frame | None] = ContextVar("tether_step", default=None)


class FencedConnection:
    """A connection to tether's database in an open transaction, committed only with a
    check of the job's lease (and, inside a step, with the step's record)."""

    def __init__(
        self, conn: Any, url: str, job: Job, release: Callable[[Any], Any] | None = None
    ) -> None:
        self.conn = conn
        self._url = url
        self._job = job
        self._release = release

    async def commit(
        self, step: str | None = None, result_json: str = "null", took: float = 0, usage: int = 0
    ) -> None:
        """Check the lease (recording ``step``) in the transaction, then commit; roll
        back and raise :class:`LeaseLostError` when the lease is gone."""
        from tether.store import caller_store

        store = caller_store(self._url, self.conn)
        job = self._job
        if step is None:
            held = await store.fence(job.id, job.lease_token)
        else:
            held = await store.save_step(
                job.id, job.lease_token, step, result_json, took=took, usage=usage
            )
        if not held:
            await self.rollback()
            raise LeaseLostError(f"job {job.id} lost its lease; its transaction was rolled back")
        done = self.conn.commit()
        if inspect.isawaitable(done):
            await done

    async def rollback(self) -> None:
        """Roll the transaction back."""
        done = self.conn.rollback()
        if inspect.isawaitable(done):
            await done

    async def abandon(self) -> None:
        """Roll back and close: the step it belongs to did not finish."""
        await self.rollback()
        await self.close()

    async def close(self) -> None:
        """Close the connection (or hand it back to the pool it came from)."""
        done = self.conn.close() if self._release is None else self._release(self.conn)
        if inspect.isawaitable(done):
            await done


def _sqlite_connection(url: str) -> sqlite3.Connection:
    from tether.store import parse_sqlite_path

    conn = sqlite3.connect(parse_sqlite_path(url), timeout=30, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")  # the lease check and the writes see one database
    return conn


def _pg_dsn(url: str) -> str:
    from tether.config import StoreConfig
    from tether.store.postgres import split_url

    return split_url(url, StoreConfig())[0]


class UserConnections:
    """The connections a worker lends its handlers' fenced transactions on PostgreSQL:
    a pool opened at the first one, up to one per job slot, each closed after
    ``max_idle`` seconds unused (an idle worker keeps none), closed with the worker.
    Connecting anew for each transaction cost about 5 ms (``bench/steps.py``)."""

    def __init__(self, url: str, size: int, max_idle: float = 30.0) -> None:
        self._url = url
        self._size = max(1, size)
        self._max_idle = max_idle
        self._pool: Any = None

    async def pool(self) -> Any:
        """The pool (a ``psycopg_pool.AsyncConnectionPool``), opened on first use."""
        if self._pool is None:
            from psycopg_pool import AsyncConnectionPool

            pool = AsyncConnectionPool(
                _pg_dsn(self._url),
                min_size=0,
                max_size=self._size,
                max_idle=self._max_idle,
                open=False,
                kwargs={"application_name": "tether-handler"},
            )
            await pool.open()
            self._pool = pool
        return self._pool

    async def close(self) -> None:
        """Close the pool, if it was opened."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()


class Steps:
    """One attempt's view of its job's durable steps (shared by a handler's context)."""

    def __init__(
        self,
        job: Job,
        store: StepStore,
        *,
        worker_id: str,
        url: str,
        connections: UserConnections | None,
        on_lease_lost: Callable[[], None],
        usage: Callable[[], int],
        max_payload_bytes: int,
        stop_requested: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.job = job
        self._store = store
        self._worker = worker_id
        self._url = url
        self._connections = connections
        self._on_lease_lost = on_lease_lost
        self._usage = usage
        self._stop_requested = stop_requested
        self._max_payload = max_payload_bytes
        self._known: dict[str, StepInfo] | None = None
        self._seen: set[str] = set()
        self._sleeps = 0

    async def known(self) -> dict[str, StepInfo]:
        """The steps earlier attempts (and this one) recorded, read once per attempt."""
        if self._known is None:
            self._known = {s.name: s for s in await self._store.steps(self.job.id)}
        return self._known

    def _claim_name(self, name: str) -> None:
        if name in self._seen:
            raise DuplicateStepError(
                f"step {name!r} was already used in this run of job {self.job.id}; "
                "each step, sleep and wait needs its own name"
            )
        self._seen.add(name)

    def note_lost(self) -> None:
        """Tell the worker the lease is lost (a fenced write was refused)."""
        self._on_lease_lost()

    def _lost(self, what: str) -> LeaseLostError:
        self._on_lease_lost()
        return LeaseLostError(f"job {self.job.id} lost its lease; {what}")

    # -- steps -----------------------------------------------------------------------

    async def begin(self, name: str) -> StepInfo | None:
        """Claim ``name`` for a step of this run; the step if an attempt finished it."""
        self._claim_name(check_name(name))
        done = (await self.known()).get(name)
        if done is not None and done.state != "done":
            raise DuplicateStepError(f"{name!r} names a {done.kind} of job {self.job.id}")
        if done is not None:
            metrics.step_ran(self.job.task, "replayed")
        return done

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """See :meth:`tether.context.JobContext.step`."""
        done = await self.begin(name)
        if done is not None:
            return done.result
        frame = _Frame(name)
        reset = _STEP.set(frame)
        began, used = time.monotonic(), self._usage()
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            encoded = self.encode(name, value)
        except BaseException:
            if frame.fenced is not None:
                await frame.fenced.abandon()
            raise
        finally:
            _STEP.reset(reset)
        took, usage = time.monotonic() - began, max(0, self._usage() - used)
        if frame.fenced is not None:
            try:
                await frame.fenced.commit(name, encoded, took, usage)
            except LeaseLostError:
                self._on_lease_lost()
                raise
            finally:
                await frame.fenced.close()
            return await self.remember(name, encoded, usage)
        return await self.save(name, encoded, took, usage)

    def run_in_thread(
        self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[str, _Frame, float]:
        """Run a step's function in the handler's thread: its encoded result, its frame
        (with the fenced transaction it opened, still to commit) and its duration."""
        frame = _Frame(name)
        reset = _STEP.set(frame)
        began = time.monotonic()
        try:
            return self.encode(name, fn(*args, **kwargs)), frame, time.monotonic() - began
        except BaseException:
            if frame.fenced is not None:
                asyncio.run(frame.fenced.abandon())
            raise
        finally:
            _STEP.reset(reset)

    def encode(self, name: str, value: Any) -> str:
        """A step's result as stored, or a clear error (nothing is stored)."""
        try:
            encoded = payload.encode(value)
        except ValueError as exc:
            raise InvalidJobError(f"step {name!r}: its result cannot be stored: {exc}") from exc
        if len(encoded.encode()) > self._max_payload:
            raise PayloadTooLargeError(
                f"step {name!r}: its result exceeds {self._max_payload} bytes"
            )
        return encoded

    async def save(self, name: str, encoded: str, took: float, usage: int) -> JSON:
        """Record a finished step under the lease; its result, as a replay returns it."""
        job = self.job
        if not await self._store.save_step(
            job.id, job.lease_token, name, encoded, took=took, usage=usage
        ):
            raise self._lost(f"step {name!r} was not recorded")
        return await self.remember(name, encoded, usage)

    async def remember(self, name: str, encoded: str, usage: int) -> JSON:
        """Note a step recorded (by :meth:`save` or with a fenced transaction)."""
        result: JSON = json.loads(encoded)
        now = datetime.now(UTC)
        known = await self.known()
        known[name] = StepInfo(
            self.job.id, name, "step", "done", result, self.job.attempt, now, now, None, usage
        )
        metrics.step_ran(self.job.task, "ran")
        return result

    # -- sleeps and waits --------------------------------------------------------------

    async def sleep(self, seconds: float, name: str | None = None) -> None:
        """See :meth:`tether.context.JobContext.sleep`."""
        if not isinstance(seconds, int | float) or seconds != seconds:
            raise InvalidJobError(f"sleep needs a number of seconds, not {seconds!r}")
        if name is None:
            self._sleeps += 1
            name = f"sleep:{self._sleeps}"
        self._claim_name(check_name(name, "sleep"))
        known = await self.known()
        if name in known and known[name].state == "done":
            return
        wakes = datetime.now(UTC).timestamp() + float(seconds)
        when = datetime.fromtimestamp(wakes, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        await self._park(name, None, float(seconds), f"sleeping until {when}")

    async def wait_for(self, signal: str, timeout: float | None = None) -> JSON:
        """See :meth:`tether.context.JobContext.wait_for`."""
        check_name(signal, "signal")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout < 0):
            raise InvalidJobError(f"a wait's timeout must be a number of seconds >= 0: {timeout!r}")
        name = signal_step(signal)
        self._claim_name(name)
        known = await self.known()
        if name in known and known[name].state == "done":
            return known[name].result
        reason = f"waiting for signal {signal!r}" + (
            f" (timeout {timeout:g}s)" if timeout is not None else ""
        )
        return await self._park(name, signal, timeout, reason)

    async def _park(
        self, name: str, signal: str | None, seconds: float | None, reason: str
    ) -> JSON:
        asked = self._stop_requested()
        if asked is not None:
            # A cancel, a pause (a person's, or the budget's) or a lost lease comes
            # first: the attempt ends as asked, and a later one sleeps or waits again.
            raise Cancelled(asked)
        found = await self._store.wait(
            self._worker,
            self.job.id,
            self.job.lease_token,
            name,
            signal=signal,
            seconds=seconds,
            reason=reason,
            usage=self._usage() if self._usage() != self.job.usage else None,
        )
        kind = "sleep" if signal is None else "signal"
        metrics.waited(kind, found.outcome)
        if found.outcome == "done":
            return None if found.payload_json is None else json.loads(found.payload_json)
        if found.outcome == "timed_out":
            assert signal is not None
            raise SignalTimeoutError(signal)
        if found.outcome == "parked":
            raise Parked(reason)
        raise self._lost(f"its {kind} {name!r} was not recorded")

    # -- fenced effects ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """See :meth:`tether.context.JobContext.transaction`."""
        frame = self._frame_for_transaction()
        if self._url.startswith("sqlite"):
            fenced = FencedConnection(_sqlite_connection(self._url), self._url, self.job)
        elif self._connections is None:
            raise InvalidJobError("a fenced transaction needs a job run by a worker")
        else:
            pool = await self._connections.pool()
            conn = await pool.getconn()
            fenced = FencedConnection(conn, self._url, self.job, release=pool.putconn)
        try:
            yield fenced.conn
        except BaseException:
            await fenced.abandon()
            raise
        if frame is not None:
            frame.fenced = fenced  # committed with the step's record, when it ends
            return
        try:
            await fenced.commit()
        except LeaseLostError:
            self._on_lease_lost()
            raise
        finally:
            await fenced.close()

    @contextlib.contextmanager
    def transaction_sync(self) -> Iterator[Any]:
        """:meth:`transaction` for a handler's thread: a blocking connection, whose
        lease check and commit run in this thread (on a loop of its own)."""
        frame = self._frame_for_transaction()
        if not self._url:
            raise InvalidJobError("a fenced transaction needs a job run by a worker")
        if self._url.startswith("sqlite"):
            conn: Any = _sqlite_connection(self._url)
        else:
            import psycopg

            conn = psycopg.connect(_pg_dsn(self._url))
        fenced = FencedConnection(conn, self._url, self.job)
        try:
            yield conn
        except BaseException:
            asyncio.run(fenced.abandon())
            raise
        if frame is not None:
            frame.fenced = fenced
            return
        try:
            asyncio.run(fenced.commit())
        except LeaseLostError:
            self._on_lease_lost()
            raise
        finally:
            asyncio.run(fenced.close())

    def _frame_for_transaction(self) -> _Frame | None:
        frame = _STEP.get()
        if frame is not None and frame.fenced is not None:
            raise InvalidJobError(f"step {frame.name!r} already opened a transaction: one per step")
        return frame


F = TypeVar("F", bound=Callable[..., Any])


def step(name: str | None = None) -> Callable[[F], F]:
    """Make a function a durable step of whatever job's handler calls it.

    ``@tether.step()`` (named by the function) or ``@tether.step("fetch")``. Called
    from a handler, it runs as ``ctx.step(name, fn, *args, **kwargs)`` would: once per
    job. An ``async def`` step is awaited from an async handler; a plain ``def`` one is
    called from a thread handler. Outside a handler it is an error.
    """

    def decorate(fn: F) -> F:
        step_name = check_name(name or fn.__qualname__)
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await _current(step_name, asynchronous=True).step(
                    step_name, fn, *args, **kwargs
                )

            return cast(F, run_async)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            return _current(step_name, asynchronous=False).step(step_name, fn, *args, **kwargs)

        return cast(F, run)

    return decorate


def _current(name: str, *, asynchronous: bool) -> Any:
    from tether.context import CURRENT, JobContext, SyncJobContext

    ctx = CURRENT.get()
    wanted = JobContext if asynchronous else SyncJobContext
    if not isinstance(ctx, wanted):
        where = "an async handler" if asynchronous else "a thread (plain def) handler"
        raise InvalidJobError(
            f"step {name!r} can only be called from {where} run by a tether worker"
        )
    return ctx
