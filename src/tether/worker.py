"""The worker: claims jobs, runs them, keeps their leases, and stops them when asked.

One worker is one asyncio loop with a few small services:

- the claimer leases up to ``claim_batch`` jobs per round trip while slots are free;
- the heartbeater makes one write per interval for all leases, flushes progress, and
  learns of cancel requests and lost leases; it also fences the worker itself when
  the database has been unreachable for too long;
- the completer records outcomes in batches, fenced by lease token;
- the rescuer (maintenance) recovers other workers' zombie jobs;
- the cancellation follow-up (maintenance) completes records that settled while their
  job still ran.

No task per job is spent on heartbeats, nor on waiting for the handler: an async handler
is the job's only task, and everything after it runs in callbacks. A slot is free once
its handler has ended; the outcome is written while the next job already runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import secrets
import signal
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether import hints as h
from tether import metrics, payload
from tether.cancellation import CancellationService
from tether.config import WorkerConfig
from tether.context import JobContext
from tether.errors import (
    Cancelled,
    ConfigError,
    Fail,
    InvalidJobError,
    LeaseLostError,
    Retry,
    WaitForChildren,
)
from tether.executors import Handle, ThreadHandle, start_handler
from tether.job import Beat, Job, JobFilter, Outcome
from tether.logs import job_fields
from tether.maintenance import CancellationFollowUp, LeaderElection, Pruner, Rescuer, Scheduler
from tether.procinfo import hostname, start_time
from tether.service import Service
from tether.states import JobState
from tether.store import Store
from tether.task import EnqueueOptions, Task

if TYPE_CHECKING:
    from tether.app import App

log = logging.getLogger("tether.worker")
ERROR_LIMIT = 4000  # characters of traceback kept on the job
# Threads in the handler pool beyond ``concurrency``: room for abandoned handlers.
SPARE_THREADS = 4
# The exit status of a worker that stopped so that its supervisor starts a fresh one
# (EX_TEMPFAIL: systemd's Restart=on-failure and most supervisors restart on it).
EXIT_RESTART = 75


@dataclass(eq=False)
class Run:
    """One attempt in progress on this worker."""

    job: Job
    task: Task
    ctx: JobContext
    handle: Handle | None = None
    #: The handler has ended (or was abandoned) and its slot is free.
    settled: bool = False
    interrupt: str | None = None
    detail: str | None = None
    stopped_by_us: bool = False
    timed_out: bool = False
    finishing: bool = False
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    # Loop time the claim that leased it was sent: its lease began no earlier.
    leased_at: float = 0.0
    began: float = 0.0
    #: Why it was asked to stop (the cancel or pause request's reason), for the log.
    reason: str | None = None
    #: The requests (cancel, pause) already logged: the heartbeat repeats them.
    logged: set[str] = field(default_factory=set)


class Completer(Service):
    """Records outcomes; whatever piles up during one write goes in the next."""

    name = "completer"

    def __init__(self, store: Store, worker_id: str) -> None:
        super().__init__(1.0, max_consecutive_errors=1, max_backoff=5.0, logger=log)
        self.store = store
        self.worker_id = worker_id
        self.pending: list[tuple[Outcome, asyncio.Future[bool]]] = []
        #: Set while no write is in progress (a stopping worker waits for it).
        self.idle = asyncio.Event()
        self.idle.set()

    def submit(self, outcome: Outcome) -> asyncio.Future[bool]:
        """Queue an outcome; the future says whether the store accepted it."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.pending.append((outcome, fut))
        self.wake()
        return fut

    async def run_once(self) -> int:
        """Write what is pending; returns how many outcomes were written."""
        batch, self.pending = self.pending, []
        if not batch:
            return 0
        self.idle.clear()
        try:
            accepted = await self.store.finish(self.worker_id, [o for o, _ in batch])
        except BaseException:
            self.pending[:0] = batch
            raise
        finally:
            self.idle.set()
        for outcome, fut in batch:
            if not fut.done():
                fut.set_result(outcome.job_id in accepted)
        return len(batch)


class Heartbeater(Service):
    """One write per interval for every lease this worker holds."""

    name = "heartbeat"

    def __init__(self, worker: Worker) -> None:
        cfg = worker.config
        super().__init__(cfg.heartbeat_interval, max_consecutive_errors=10**9, logger=log)
        self.worker = worker
        self.last_ok = asyncio.get_running_loop().time()
        self.fenced = False

    async def run_once(self) -> int:
        """Extend every lease; act on lost leases and control requests."""
        w = self.worker
        loop = asyncio.get_running_loop()
        runs = w.beating()
        beats = [_beat(r) for r in runs]
        sent = loop.time()
        # A stalled or blackholed connection must not keep us waiting past the moment
        # we have to stop our jobs: another worker may take them once the leases end.
        timeout = max(1.0, w.config.heartbeat_interval)
        first = min((self.fence_point(r) for r in runs), default=None)
        if first is not None and first > sent:
            timeout = min(timeout, first - sent)
        elif first is not None:
            # Past a fence point already (the last rounds failed fast or the pause
            # between rounds crossed it): stop those jobs now, not after one more try.
            self._maybe_fence()
        # Not wait_for: it waits for the cancelled call to unwind, and the driver waits for
        # the server to acknowledge the cancel, which a partitioned server never does.
        call = asyncio.ensure_future(w.store.heartbeat(w.id, beats, w.config.lease_duration))
        call.add_done_callback(_retrieve)
        try:
            done, _ = await asyncio.wait({call}, timeout=timeout)
            if not done:
                raise TimeoutError(f"no answer from the database within {timeout:.1f}s")
            res = call.result()
        except Exception:
            metrics.heartbeat_failed()
            self._maybe_fence()
            raise
        finally:
            call.cancel()  # a no-op once it is done; never waited for
        self.last_ok = sent
        self.fenced = False
        w.report_threads()  # in case the write made when it changed failed
        if self.errors:
            # The database answers again: the loops that were backing off (for up to
            # max_backoff) try again now.
            for svc in w._services:
                if svc is not self:
                    svc.wake()
        for run in runs:
            if run.job.id not in res.alive and not run.finishing and run.job.id in w.running:
                log.warning("job %s: lease lost; stopping it and recording nothing", run.job.id)
                w.interrupt(run, "lease_lost")
        heard: list[tuple[Run, str]] = []
        for req in res.requests:
            held = w.running.get(req.job_id)
            if held is not None and req.cancel:
                w.interrupt(held, "cancel", force=req.force)
                heard.append((held, "cancel"))
            elif held is not None and req.pause:
                w.interrupt(held, "pause", detail="pause requested")
                heard.append((held, "pause"))
        await w.log_requests(heard)
        return len(beats)

    @property
    def fence_at(self) -> float:
        """Loop time at which our leases may be about to expire, minus the margin.

        ``last_ok`` is when the last successful heartbeat was *sent*; the database
        extended the leases no earlier than that.
        """
        config = self.worker.config
        return self.last_ok + config.lease_duration - config.self_fence_margin

    def fence_point(self, run: Run) -> float:
        """:attr:`fence_at` for one job: a job claimed after the last successful
        heartbeat has a lease of its own, no older than the claim."""
        return self.fence_at + max(0.0, run.leased_at - self.last_ok)

    def _maybe_fence(self) -> None:
        now = asyncio.get_running_loop().time()
        silent = now - self.last_ok
        due = [
            run
            for run in self.worker.running.values()
            # A timer may fire a hair early.
            if not run.finishing and now >= self.fence_point(run) - 0.01
        ]
        if not due:
            return
        if not self.fenced:
            log.error(
                "no heartbeat for %.1fs: stopping %d job(s) before their leases expire",
                silent,
                len(due),
            )
        self.fenced = True
        for run in due:
            self.worker.interrupt(run, "lease_lost")


class Ramp:
    """A gradual start: how many jobs a worker may have claimed ``elapsed`` seconds in.

    The first job at once, jobs 2 to ``warm_jobs`` one per ``warm_interval``, then the
    rest of the backlog found at start spread evenly over ``window`` seconds; after
    that, no limit. A window of 0 turns the ramp off.
    """

    def __init__(self, config: WorkerConfig, backlog: int) -> None:
        self.window = config.ramp_window
        self.warm_jobs = config.ramp_warm_jobs
        self.warm_interval = config.ramp_warm_interval
        self.rest = max(0, backlog - self.warm_jobs)

    @property
    def warm_time(self) -> float:
        """Seconds until the warm phase has let ``warm_jobs`` jobs start."""
        return (self.warm_jobs - 1) * self.warm_interval

    def allowed(self, elapsed: float) -> int | None:
        """Jobs that may have been claimed by now; ``None`` once the ramp is over."""
        if self.window <= 0 or elapsed >= self.warm_time + self.window:
            return None
        if elapsed < self.warm_time:
            return 1 + int(elapsed / self.warm_interval)
        return self.warm_jobs + int(self.rest * (elapsed - self.warm_time) / self.window)

    def next_step(self, elapsed: float) -> float:
        """Seconds until :meth:`allowed` may grow."""
        if elapsed < self.warm_time:
            return self.warm_interval - (elapsed % self.warm_interval)
        if self.rest == 0:
            return self.warm_time + self.window - elapsed
        return self.window / self.rest


class Claimer(Service):
    """Leases jobs while slots are free (and, during a gradual start, the ramp allows)."""

    name = "claimer"

    def __init__(self, worker: Worker) -> None:
        cfg = worker.config
        super().__init__(
            cfg.poll_interval,
            max_consecutive_errors=cfg.max_consecutive_errors,
            max_backoff=cfg.max_backoff,
            logger=log,
        )
        self.worker = worker
        self.claimed = 0
        self.ramp: Ramp | None = None
        self.started = asyncio.get_running_loop().time()
        #: Set while no round is in progress (a stopping worker waits for it).
        self.idle = asyncio.Event()
        self.idle.set()

    def delay(self) -> float:
        base = super().delay()
        if self.ramp is None or self.errors:
            return base
        elapsed = asyncio.get_running_loop().time() - self.started
        if self.ramp.allowed(elapsed) is None:
            return base
        return min(base, self.ramp.next_step(elapsed))

    async def run_once(self) -> int:
        """Claim and start up to the free slots (at most ``claim_batch``)."""
        w = self.worker
        free = w.free_slots()
        if w.stopping or free <= 0:
            return 0
        self.idle.clear()
        try:
            return await self._claim(free)
        finally:
            self.idle.set()

    async def _claim(self, free: int) -> int:
        w = self.worker
        tasks = w.task_names
        room = w.thread_room()
        if room is not None and room < free:
            # Never claim a thread job that would wait for a thread: abandoned handlers
            # may hold the pool for good.
            if room > 0:
                free = room
            elif w.unthreaded_task_names:
                tasks = w.unthreaded_task_names
            else:
                return 0
        limit = min(free, w.config.claim_batch)
        if self.ramp is not None:
            allowed = self.ramp.allowed(asyncio.get_running_loop().time() - self.started)
            if allowed is None:
                self.ramp = None
            else:
                limit = min(limit, allowed - self.claimed)
                if limit <= 0:
                    return 0
        # With room for more than one batch, two claims go out at once (on PostgreSQL,
        # two connections; SKIP LOCKED keeps their jobs apart): a claim's round trip,
        # not the database, is what a fast drain waits on.
        batch = w.config.claim_batch
        if free <= batch or self.ramp is not None:
            sizes = [limit]
        else:
            sizes = [batch, min(batch, free - batch)]
        sent = asyncio.get_running_loop().time()
        rounds = await asyncio.gather(
            *(
                w.store.claim(w.id, w.config.queues, tasks, size, w.config.lease_duration)
                for size in sizes
            ),
            return_exceptions=True,
        )
        got, full, failure = 0, True, None
        for size, jobs in zip(sizes, rounds, strict=True):
            if isinstance(jobs, BaseException):
                # The other claim's jobs are ours all the same: run them, then report.
                failure, full = jobs, False
                continue
            got += len(jobs)
            full = full and len(jobs) == size
            for job in jobs:
                if w.stopping:
                    w.hand_back(job)  # the claim was out when the stop began
                else:
                    w.launch(job, leased_at=sent)
        self.claimed += got
        if failure is not None:
            raise failure
        if full and w.free_slots() > 0 and self.ramp is None:
            self.wake()  # there may be more waiting
        return got


class Worker:
    """Runs the jobs of one :class:`~tether.App`; see the module docstring."""

    def __init__(self, app: App, config: WorkerConfig) -> None:
        if not app.tasks:
            raise ConfigError("the app has no tasks registered; a worker would claim nothing")
        self.app = app
        self.config = config
        self.host = hostname()
        self.pid = os.getpid()
        self.id = f"{self.host}:{self.pid}:{secrets.token_hex(3)}"
        self.task_names = sorted(app.tasks)
        self.running: dict[int, Run] = {}
        self.stopping = False
        self._store: Store | None = None
        self.thread_pool_size = config.concurrency + SPARE_THREADS
        self._threads = ThreadPoolExecutor(
            max_workers=self.thread_pool_size, thread_name_prefix="tether-job"
        )
        threaded = {n for n, t in app.tasks.items() if t.executor == "thread"}
        self.unthreaded_task_names = [n for n in self.task_names if n not in threaded]
        self._has_thread_tasks = bool(threaded)
        #: Pool threads taken: by thread handlers running or waiting for a thread, and by
        #: abandoned ones that still run.
        self.threads_busy = 0
        #: Attempts whose handler thread was abandoned but still runs.
        self.abandoned: set[Run] = set()
        self.thread_pool_full = False
        self._threads_reported = (0, False)
        self._threads_report_lock = asyncio.Lock()
        self._reports: set[asyncio.Task[None]] = set()
        #: What the process should exit with: EXIT_RESTART once it stopped itself.
        self.exit_code = 0
        self._services: list[Service] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._done = asyncio.Event()
        self._stop_task: asyncio.Task[None] | None = None
        self._stop_started = False
        self._hard = asyncio.Event()
        #: Handlers that have not ended yet (``running`` also holds jobs whose outcome
        #: is still being written).
        self.executing = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.claimer: Claimer
        self.heartbeater: Heartbeater
        self.completer: Completer
        self.rescuer: Rescuer
        self.follow_up: CancellationFollowUp
        self.leader: LeaderElection
        self.pruner: Pruner
        self.scheduler: Scheduler

    @property
    def store(self) -> Store:
        """The store this worker uses (after :meth:`start`)."""
        assert self._store is not None, "worker not started"
        return self._store

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, *, services: bool = True) -> None:
        """Register, then start the background services (``services=False`` leaves them
        to the caller's ``run_once()`` calls, as tests do)."""
        self._store = await self.app.store()
        listen = getattr(self._store, "listen", None)
        if listen is not None:
            await listen()
        await self._store.register_worker(
            self.id,
            self.config.name,
            self.host,
            self.pid,
            start_time(self.pid),
            self.config.queues,
            self.config.concurrency,
            tasks=self.task_names,
        )
        self.claimer = Claimer(self)
        self.heartbeater = Heartbeater(self)
        self.completer = Completer(self._store, self.id)
        # Rescue, the cancellation follow-up, pruning and schedules run on one
        # maintenance leader at a time.
        maintenance = self.app.config.maintenance
        self.leader = LeaderElection(
            self._store,
            self.id,
            ttl=maintenance.leader_ttl,
            interval=maintenance.leader_renew_interval,
            max_consecutive_errors=self.config.max_consecutive_errors,
            max_backoff=self.config.max_backoff,
        )
        self.rescuer = Rescuer(
            self._store,
            max_consecutive_errors=self.config.max_consecutive_errors,
            max_backoff=self.config.max_backoff,
            interval=self.config.rescue_interval,
            session_grace=self.config.session_dead_after,
            leader=self.leader,
        )
        self.follow_up = CancellationFollowUp(
            CancellationService(
                self._store,
                self.app.config.wait_poll_interval,
                adopt_after=self.app.config.cancellation_adopt_after,
            ),
            interval=self.config.rescue_interval,
            max_consecutive_errors=self.config.max_consecutive_errors,
            max_backoff=self.config.max_backoff,
            leader=self.leader,
        )
        self.pruner = Pruner(self._store, self.app.config.retention, leader=self.leader)
        self.scheduler = Scheduler(
            self.app,
            self._store,
            interval=maintenance.schedule_interval,
            leader=self.leader,
            max_consecutive_errors=self.config.max_consecutive_errors,
            max_backoff=self.config.max_backoff,
        )
        await self._open()
        self._services = [
            self.completer,
            self.heartbeater,
            self.rescuer,
            self.follow_up,
            self.claimer,
            self.leader,
            self.pruner,
            self.scheduler,
        ]
        log.info(
            "worker %s started: queues=%s concurrency=%d tasks=%s",
            self.id,
            ",".join(self.config.queues),
            self.config.concurrency,
            ",".join(self.task_names),
        )
        if services:
            # The completer runs even when the other services are driven by hand: a
            # finishing job waits on it.
            for svc in self._services:
                self._tasks.append(asyncio.create_task(svc.run(), name=f"tether-{svc.name}"))
            self._tasks.append(asyncio.create_task(self._forward_hints(), name="tether-hints"))
        else:
            self._tasks.append(asyncio.create_task(self.completer.run(), name="tether-completer"))

    async def _open(self) -> None:
        """A graceful opening: recover orphans first, then (if set) start gradually.

        Orphans are jobs still leased by dead workers, including this host's previous
        incarnation of this worker; recovered jobs with a checkpoint go back to their
        place in line, ahead of newer work.
        """
        try:
            recovered = await self.rescuer.run_once()
        except Exception as exc:
            log.warning("could not recover orphaned jobs at start: %s", exc)
            recovered = []
        if recovered:
            with_checkpoint = sum(1 for j in recovered if j.checkpoint is not None)
            log.info(
                "recovered %d orphaned job(s) at start (%d with a checkpoint go first)",
                len(recovered),
                with_checkpoint,
            )
        if self.config.ramp_window > 0:
            backlog = 0
            with contextlib.suppress(Exception):
                for queue in await self.store.list_queues():
                    if queue.name in self.config.queues:
                        backlog += queue.counts.get("queued", 0) + queue.counts.get("retrying", 0)
            self.claimer.ramp = Ramp(self.config, backlog)
            log.info(
                "gradual start: %d job(s) waiting; first now, then up to %d over %.0fs, "
                "the rest over %.0fs",
                backlog,
                self.config.ramp_warm_jobs,
                self.claimer.ramp.warm_time,
                self.config.ramp_window,
            )

    async def run(self, *, handle_signals: bool = False) -> None:
        """Start and run until :meth:`stop` (or SIGTERM/SIGINT with ``handle_signals``)."""
        loop = asyncio.get_running_loop()
        early: list[int] = []
        if handle_signals:
            # Caught from the start: a signal during start-up (the claimer may already
            # hold jobs) stops gracefully once started, instead of killing the process.
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, early.append, sig)
        await self.start()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
            for _ in early[:2]:
                self.request_stop()
        await self._done.wait()

    def request_stop(self) -> None:
        """First call: graceful stop. Second call: stop at once."""
        if self._stop_task is None:
            log.info("stopping: no new claims; running jobs get %.0fs", self.config.stop_timeout)
            self._halt_claims()  # now, not when the stop task first runs
            self._stop_task = asyncio.ensure_future(self.stop())
        else:
            log.warning("second stop signal: releasing running jobs now")
            self._hard.set()

    async def stop(self) -> None:
        """Stop claiming, give running jobs ``stop_timeout``, release the rest, exit.

        Released jobs go back to ``queued`` with their checkpoint and without spending
        an attempt.
        """
        if self._stop_started:
            await self._done.wait()
            return
        self._stop_started = True
        self._halt_claims()
        # A claim already out hands its jobs back unstarted (see Claimer); wait for it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.claimer.idle.wait(), self.config.stop_timeout)
        with contextlib.suppress(Exception):
            await self.store.set_worker_state(self.id, "draining")
        await self._wait_jobs(self.config.stop_timeout)
        for run in list(self.running.values()):
            if not run.finishing:
                # A process gets SIGTERM (then SIGKILL after kill_timeout), so it can
                # still save a checkpoint, unless a second signal asked for speed.
                force = run.task.executor != "process" or self._hard.is_set()
                self.interrupt(run, "shutdown", force=force)
        # Bounded: abandonment settles every handler within these limits.
        grace = max(self.config.cancel_grace, self.config.kill_timeout)
        await self._wait_jobs(grace + 5.0, hard_stops=False)
        await self._drain_completer()
        for svc in self._services:
            svc.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.leader.resign()  # another worker leads at its next round
        with contextlib.suppress(Exception):
            await self.store.set_worker_state(self.id, "stopped")
        self._threads.shutdown(wait=False, cancel_futures=True)
        log.info("worker %s stopped", self.id)
        self._done.set()

    def _halt_claims(self) -> None:
        self.stopping = True
        self.claimer.stop()
        # Every handler hears of the stop now, not at stop_timeout: it may still save a
        # checkpoint, which its release keeps.
        for run in self.running.values():
            run.ctx.stopping.set("shutdown")

    def hand_back(self, job: Job) -> None:
        """Release a job claimed as the worker began to stop, without starting it (and
        without spending its attempt)."""
        # stop() drains the completer after the claimer's last round, so this is written.
        self.completer.submit(
            _unstarted(job, "released at worker shutdown (claimed as the stop began; not started)")
        )

    async def _drain_completer(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while loop.time() < deadline:
            if not self.completer.idle.is_set():
                # The service's own write is out: let it land (or fail back into pending).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.completer.idle.wait(), deadline - loop.time())
                continue
            if not self.completer.pending:
                return
            try:
                await self.completer.run_once()
            except Exception as exc:
                log.warning(
                    "could not record %d outcomes yet: %s", len(self.completer.pending), exc
                )
                await asyncio.sleep(0.5)

    async def _wait_jobs(self, timeout: float, *, hard_stops: bool = True) -> None:
        """Wait until no job is held (outcomes written), ``timeout`` passes, or
        (optionally) a hard stop."""
        waits = [asyncio.ensure_future(self._idle.wait())]
        if hard_stops:
            waits.append(asyncio.ensure_future(self._hard.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            for waiter in waits:
                waiter.cancel()

    async def _forward_hints(self) -> None:
        """Turn notifications into early wake-ups of the claimer and heartbeater."""
        hints = self.store.hints

        async def enqueued() -> None:
            with hints.subscribe(h.ENQUEUED, self.config.queues) as sub:
                while True:
                    await sub.get(None)
                    self.claimer.wake()

        async def control() -> None:
            with hints.subscribe(h.CONTROL) as sub:
                while True:
                    keys = await sub.get(None)
                    if h.ANY in keys or any(k.isdigit() and int(k) in self.running for k in keys):
                        self.heartbeater.wake()

        async def cancels() -> None:
            # A cancel request is delivered as soon as its commit is heard of, not after
            # one more round trip: the heartbeat that follows confirms it, and applies
            # ``force``.
            with hints.subscribe(h.CANCEL) as sub:
                while True:
                    keys = await sub.get(None)
                    held = [self.running.get(int(k)) for k in keys if k.isdigit()]
                    for run in held:
                        if run is not None and not run.finishing:
                            self.interrupt(run, "cancel")
                    if h.ANY in keys or any(held):
                        self.heartbeater.wake()

        await asyncio.gather(enqueued(), control(), cancels())

    # -- running jobs --------------------------------------------------------------------

    def beating(self) -> list[Run]:
        """The attempts whose leases the next heartbeat extends.

        Not those whose lease is lost, nor those whose outcome is being written: the
        completer holds their rows, and a heartbeat waiting on its locks (or taking
        them in another order) would only slow it down.
        """
        return [r for r in self.running.values() if r.interrupt != "lease_lost" and not r.finishing]

    def free_slots(self) -> int:
        """How many more jobs may be claimed now.

        A slot is taken while a handler runs. Jobs whose outcome is still being written
        hold no slot, but at most ``concurrency`` of them are held besides: a database
        slow to take outcomes slows claiming too.
        """
        concurrency = self.config.concurrency
        return min(concurrency - self.executing, 2 * concurrency - len(self.running))

    def launch(self, job: Job, *, leased_at: float | None = None) -> None:
        """Run a claimed job (``leased_at``: loop time the claim was sent, default now)."""
        task = self.app.tasks[job.task]
        unfit: InvalidJobError | None = None
        try:
            args = task.arguments.for_call(job.args)
        except InvalidJobError as exc:
            unfit = exc  # no attempt could ever bind them: fail below, not retry
        else:
            if args is not job.args:
                job = dataclasses.replace(job, args=args)
        ctx = JobContext(
            job,
            save=lambda data: self.store.save_checkpoint(job.id, job.lease_token, data),
            save_artifact=lambda name, data: self.store.save_artifact(
                job.id, job.lease_token, name, data
            ),
            on_lease_lost=lambda: self._lease_lost(job.id),
            on_usage=lambda usage: self._check_budget(job.id, usage),
            spawn=lambda name, args: self._spawn(job, name, args),
            children=lambda: self.app.children(job.id),
            max_payload_bytes=self.app.config.max_payload_bytes,
            max_artifact_bytes=self.app.config.max_artifact_bytes,
            threaded=task.executor == "thread",
        )
        loop = asyncio.get_running_loop()
        run = Run(job, task, ctx)
        run.began = loop.time()
        run.leased_at = run.began if leased_at is None else leased_at
        self.running[job.id] = run
        self.executing += 1
        self._idle.clear()
        metrics.job_started(job)
        log.debug(
            "job %s (%s) attempt %d started",
            job.id,
            job.task,
            job.attempt,
            extra=job_fields(
                "job_started",
                job_id=job.id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
                worker_id=self.id,
            ),
        )
        try:
            if unfit is not None:
                raise Fail(f"the arguments do not fit the handler: {unfit}")
            run.handle = start_handler(
                task,
                ctx,
                self._threads,
                grace=self.config.cancel_grace,
                kill_timeout=self.config.kill_timeout,
            )
        except Exception as exc:  # e.g. args the handler does not take: a failed attempt
            self._settle(run, "error", exc)
            return
        run.handle.future.add_done_callback(functools.partial(self._handler_done, run))
        if job.timeout:
            run.timers.append(loop.call_later(job.timeout, self._time_out, run))
        if isinstance(run.handle, ThreadHandle):
            self.threads_busy += 1
            run.handle.thread.add_done_callback(
                functools.partial(self._thread_freed_threadsafe, loop, run)
            )
            run.timers.append(
                loop.call_later(self.config.handler_start_timeout, self._check_started, run)
            )

    # -- the thread pool -----------------------------------------------------------------

    def thread_room(self) -> int | None:
        """Pool threads free for thread jobs (``None``: the app has no thread tasks)."""
        if not self._has_thread_tasks:
            return None
        return self.thread_pool_size - self.threads_busy

    def _check_started(self, run: Run) -> None:
        """A handler still waiting for a thread goes back to the queue unstarted."""
        if run.settled or run.handle is None or not run.handle.withdraw():
            return
        log.warning(
            "job %s (%s): no thread free to start it within %.0fs; handing it back unstarted",
            run.job.id,
            run.job.task,
            self.config.handler_start_timeout,
        )
        self._settle(run, "unstarted", None)

    def _thread_freed_threadsafe(
        self, loop: asyncio.AbstractEventLoop, run: Run, _: concurrent.futures.Future[Any]
    ) -> None:
        # Called in the pool thread (or at once, if already done).
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to tell
            loop.call_soon_threadsafe(self._thread_freed, run)

    def _thread_freed(self, run: Run) -> None:
        self.threads_busy -= 1
        if run in self.abandoned:
            self.abandoned.discard(run)
            metrics.threads_abandoned(-1)
            log.info(
                "job %s: its abandoned thread has ended (%d abandoned still running)",
                run.job.id,
                len(self.abandoned),
            )
        self._threads_changed()
        if not self.stopping:
            self.claimer.wake()

    def _thread_abandoned(self, run: Run) -> None:
        self.abandoned.add(run)
        metrics.threads_abandoned(1)
        log.warning(
            "job %s (%s): its handler thread ignored being stopped and still runs; "
            "%d abandoned thread(s) hold %d of %d pool threads",
            run.job.id,
            run.job.task,
            len(self.abandoned),
            len(self.abandoned),
            self.thread_pool_size,
        )
        self._threads_changed()

    def _threads_changed(self) -> None:
        """Report the pool's state; stop the worker past ``max_abandoned_threads``."""
        full = bool(self.abandoned) and self.threads_busy >= self.thread_pool_size
        if full != self.thread_pool_full:
            self.thread_pool_full = full
            metrics.thread_pool_full(full)
            if full:
                log.error(
                    "thread pool exhausted: %d abandoned handler thread(s) still run; no "
                    "thread jobs (%s) are claimed until one ends. Restart the worker to "
                    "get the threads back (max_abandoned_threads does it for you)",
                    len(self.abandoned),
                    ", ".join(sorted(set(self.task_names) - set(self.unthreaded_task_names))),
                )
            else:
                log.warning("thread pool has room again: claiming thread jobs")
        limit = self.config.max_abandoned_threads
        if limit is not None and len(self.abandoned) > limit and not self.stopping:
            log.error(
                "%d abandoned handler threads still run (max_abandoned_threads=%d): "
                "stopping gracefully, for a fresh worker to take over (exit code %d)",
                len(self.abandoned),
                limit,
                EXIT_RESTART,
            )
            self.exit_code = EXIT_RESTART
            self.request_stop()
        self.report_threads()

    def report_threads(self) -> None:
        """Write the abandoned-thread count and pool state to the worker's row, if they
        changed since the last successful write."""
        if (len(self.abandoned), self.thread_pool_full) == self._threads_reported:
            return
        task = asyncio.ensure_future(self._write_threads())
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _write_threads(self) -> None:
        # One write at a time, each with the state current when it is sent: the last
        # one to land is the latest.
        async with self._threads_report_lock:
            state = (len(self.abandoned), self.thread_pool_full)
            if state == self._threads_reported:
                return
            try:
                await self.store.set_worker_threads(self.id, *state)
            except Exception as exc:  # the heartbeat tries again
                log.warning("could not record this worker's abandoned threads: %s", exc)
                return
            self._threads_reported = state

    def _lease_lost(self, job_id: int) -> None:
        run = self.running.get(job_id)
        if run is not None:
            self.interrupt(run, "lease_lost")

    async def _spawn(self, parent: Job, task: str, args: dict[str, Any]) -> Job:
        new = dataclasses.replace(
            self.app.new_job(task, args, EnqueueOptions()), parent_id=parent.id
        )
        child = await self.store.spawn(parent.id, parent.lease_token, new)
        if child is None:
            # Refused because of a pending cancel or a lost lease: the heartbeat tells
            # which, and the job ends accordingly. Only this spawn fails here.
            raise LeaseLostError(
                f"job {parent.id} can no longer spawn children: it was cancelled, deleted "
                "or lost its lease"
            )
        return child

    def _check_budget(self, job_id: int, usage: int) -> None:
        run = self.running.get(job_id)
        budget = run.job.budget if run is not None else None
        if run is not None and budget is not None and usage > budget:
            self.interrupt(run, "pause", detail=f"budget exceeded: used {usage} of {budget}")

    def _handler_done(self, run: Run, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            self._settle(run, "cancelled", None)
        elif fut.exception() is not None:
            self._settle(run, "error", fut.exception())
        else:
            self._settle(run, "result", fut.result())

    def _settle(self, run: Run, kind: str, value: Any) -> None:
        """The handler ended (or was abandoned): free its slot and record the outcome."""
        if run.settled:
            return
        run.settled = True
        self.executing -= 1
        for timer in run.timers:
            timer.cancel()
        if isinstance(run.handle, ThreadHandle) and not run.handle.thread.done():
            self._thread_abandoned(run)
        job = run.job
        try:
            outcome = self._outcome(run, kind, value)
            metrics.job_ran(job.task, outcome, asyncio.get_running_loop().time() - run.began)
            if outcome is None:
                self._forget(run)
                return
            # The last progress and usage travel with the outcome, not a late heartbeat.
            current, total = run.ctx.progress
            if current is not None or total is not None or run.ctx.usage != job.usage:
                outcome = dataclasses.replace(
                    outcome,
                    usage=run.ctx.usage if run.ctx.usage != job.usage else None,
                    progress_current=current,
                    progress_total=total,
                )
            run.finishing = True
            recorded = self.completer.submit(outcome)
            recorded.add_done_callback(functools.partial(self._recorded, run, outcome))
        except Exception:
            log.exception("job %s: internal error in the worker", job.id)
            self._forget(run)
        finally:
            if not self.stopping:
                self.claimer.wake()

    def _recorded(self, run: Run, outcome: Outcome, fut: asyncio.Future[bool]) -> None:
        job = run.job
        self._forget(run)
        if fut.cancelled():
            return
        if fut.result():
            duration = asyncio.get_running_loop().time() - run.began
            reason = outcome.reason
            if outcome.state in (JobState.CANCELLED, JobState.PAUSED) and run.reason:
                reason = run.reason
            log.log(
                logging.DEBUG if outcome.state is JobState.SUCCEEDED else logging.INFO,
                "job %s (%s) attempt %d: %s after %.3fs%s",
                job.id,
                job.task,
                job.attempt,
                outcome.state,
                duration,
                f" ({reason})" if reason else "",
                extra=job_fields(
                    "job_finished",
                    job_id=job.id,
                    task=job.task,
                    queue=job.queue,
                    attempt=job.attempt,
                    duration=round(duration, 6),
                    state=outcome.state.value,
                    reason=reason,
                    worker_id=self.id,
                ),
            )
        else:
            metrics.lease_lost()
            log.warning("job %s: lease lost before its outcome was recorded", job.id)

    async def log_requests(self, heard: list[tuple[Run, str]]) -> None:
        """Log at INFO that running jobs were asked to ``cancel`` or ``pause``, with each
        request's reason, once per request (the heartbeat returns it until the job stops).
        The heartbeat carries only the flags, so the reasons are read in one query."""
        new = [(run, kind) for run, kind in heard if kind not in run.logged]
        if not new:
            return
        for run, kind in new:
            run.logged.add(kind)
        ids = tuple({run.job.id for run, _ in new})
        try:
            found = {
                j.id: j for j in await self.store.list_jobs(JobFilter(ids=ids, limit=len(ids)))
            }
        except Exception as exc:  # the log lines must not cost the heartbeat
            log.debug("could not read the reasons of %d request(s): %s", len(ids), exc)
            found = {}
        for run, kind in new:
            job, now = run.job, found.get(run.job.id)
            if now is not None:
                run.reason = now.cancel_reason if kind == "cancel" else now.pause_reason
            force = kind == "cancel" and now is not None and now.cancel_force
            log.info(
                "job %s (%s) attempt %d: %s requested%s: %s",
                job.id,
                job.task,
                job.attempt,
                kind,
                " (force)" if force else "",
                run.reason or "no reason given",
                extra=job_fields(
                    f"{kind}_requested",
                    job_id=job.id,
                    task=job.task,
                    queue=job.queue,
                    attempt=job.attempt,
                    reason=run.reason,
                    worker_id=self.id,
                ),
            )

    def _forget(self, run: Run) -> None:
        if self.running.get(run.job.id) is run:
            del self.running[run.job.id]
        if not self.running:
            self._idle.set()
        if not self.stopping:
            self.claimer.wake()

    def _time_out(self, run: Run) -> None:
        run.timed_out = True
        self._stop_handler(run, force=True)

    def interrupt(
        self, run: Run, reason: str, *, force: bool = False, detail: str | None = None
    ) -> None:
        """Ask a running job to stop: ``cancel``, ``pause``, ``shutdown`` or ``lease_lost``.

        The handler sees ``ctx.cancelled`` at once. A lost lease or ``force`` stops it at
        once (a process gets SIGKILL). Otherwise an async handler gets ``cancel_grace``
        before its task is cancelled, a process gets SIGTERM now and SIGKILL after
        ``kill_timeout``, and a thread handler, which can only stop cooperatively, is
        abandoned after ``cancel_timeout``.
        """
        if reason == "lease_lost" and run.interrupt != "lease_lost":
            metrics.lease_lost()
        if run.interrupt is None or reason == "lease_lost":
            run.interrupt = reason
            run.detail = detail
        run.ctx.cancelled.set(reason)
        handle = run.handle
        if handle is None or handle.future.done():
            return
        if reason == "lease_lost" or force:
            self._stop_handler(run, force=True)
            return
        loop = asyncio.get_running_loop()
        if run.task.executor == "process":
            self._stop_handler(run, force=False)
        elif run.task.executor == "async":
            run.timers.append(loop.call_later(self.config.cancel_grace, self._stop_handler, run))
        else:
            run.timers.append(loop.call_later(self.config.cancel_timeout, self._stop_handler, run))

    def _stop_handler(self, run: Run, force: bool = False) -> None:
        handle = run.handle
        if handle is None or handle.future.done() or run.settled:
            return
        run.stopped_by_us = True
        metrics.handler_stopped(run.task.executor, force)
        handle.stop(force)
        loop = asyncio.get_running_loop()
        run.timers.append(loop.call_later(handle.abandon_after, self._abandon, run))

    def _abandon(self, run: Run) -> None:
        if not run.settled:
            log.warning("job %s ignored being stopped; abandoning it", run.job.id)
            if run.handle is not None:
                run.handle.stopped_by = "abandoned"
            self._settle(run, "cancelled", None)

    def _outcome(self, run: Run, kind: str, value: Any) -> Outcome | None:
        job = run.job
        if run.interrupt == "lease_lost":
            return None
        if kind == "unstarted":
            return _unstarted(
                job,
                "handed back unstarted: no thread free to start it within "
                f"{self.config.handler_start_timeout:g}s",
            )
        phase_end = value if isinstance(value, WaitForChildren) else None
        # A phase that ended on its own is recorded even under a pending pause or cancel:
        # the store lets a cancel win, and a pause applies when the next phase starts.
        if phase_end is not None and not run.stopped_by_us:
            return Outcome(
                job.id,
                job.lease_token,
                JobState.BLOCKED,
                phase=phase_end.phase,
                reason=f"waiting for children; next phase {phase_end.phase}",
            )
        if kind == "result" and not run.stopped_by_us:
            try:
                encoded = payload.encode(value)
            except ValueError as exc:
                return self._failure(run, Fail(f"result cannot be stored: {exc}"))
            if len(encoded.encode()) > self.app.config.max_payload_bytes:
                return self._failure(run, Fail("result exceeds the payload size limit"))
            return Outcome(job.id, job.lease_token, JobState.SUCCEEDED, result_json=encoded)
        stopped_by = (run.handle.stopped_by if run.handle else None) or "cooperative"
        if run.interrupt == "cancel":
            return Outcome(
                job.id,
                job.lease_token,
                JobState.CANCELLED,
                error=f"cancelled while running (stopped: {stopped_by})",
                stopped_by=stopped_by,
            )
        if run.interrupt == "pause":
            return Outcome(
                job.id,
                job.lease_token,
                JobState.PAUSED,
                reason=run.detail or "pause requested",
                stopped_by=stopped_by,
            )
        if run.interrupt == "shutdown" or self._stepped_aside(run, kind, value):
            return Outcome(
                job.id,
                job.lease_token,
                JobState.QUEUED,
                reason="released at worker shutdown",
                stopped_by=stopped_by,
            )
        if run.timed_out:
            return self._failure(run, TimeoutError(f"timed out after {job.timeout}s"))
        if kind == "error":
            return self._failure(run, value)
        return self._failure(run, RuntimeError("handler was cancelled"))

    @staticmethod
    def _stepped_aside(run: Run, kind: str, value: Any) -> bool:
        """Whether the handler ended itself because the worker is stopping: it raised
        ``Cancelled`` (or was cancelled) after ``ctx.stopping``, unasked otherwise."""
        return (
            run.interrupt is None
            and run.ctx.stopping.is_set()
            and (kind == "cancelled" or isinstance(value, Cancelled))
        )

    def _failure(self, run: Run, exc: BaseException) -> Outcome:
        job, task = run.job, run.task
        error = _describe(exc)
        if isinstance(exc, Fail):
            return Outcome(job.id, job.lease_token, JobState.FAILED, error=error, reason="failed")
        retries = job.max_attempts - 1
        if job.attempt >= job.max_attempts:
            reason = f"max retries exceeded ({retries}): {_first_line(error)}"
            return Outcome(job.id, job.lease_token, JobState.FAILED, error=error, reason=reason)
        delay = exc.delay if isinstance(exc, Retry) and exc.delay is not None else None
        if delay is None:
            delay = task.retry.delay(job.attempt)
        reason = f"retry {job.attempt}/{retries} in {delay:.1f}s: {_first_line(error)}"
        return Outcome(
            job.id, job.lease_token, JobState.RETRYING, error=error, delay=delay, reason=reason
        )

    # -- for tests and tools -------------------------------------------------------------

    def beats(self) -> list[Beat]:
        """The leases the next heartbeat would extend."""
        return [_beat(r) for r in self.beating()]

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no job runs on this worker (for tests and the demo)."""
        async with asyncio.timeout(timeout):
            await self._idle.wait()


def _unstarted(job: Job, reason: str) -> Outcome:
    """Back to ``queued``, its handler never started: the attempt is not spent."""
    return Outcome(job.id, job.lease_token, JobState.QUEUED, reason=reason)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark an abandoned call's exception as seen (it was handled, or is moot)."""
    if not fut.cancelled():
        fut.exception()


def _beat(run: Run) -> Beat:
    usage = run.ctx.usage if run.ctx.usage != run.job.usage else None
    return Beat(run.job.id, run.job.lease_token, *run.ctx.progress, usage=usage)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, Retry | Fail | TimeoutError):
        return payload.printable(f"{type(exc).__name__}: {exc}")
    text = "".join(traceback.format_exception(exc))
    return payload.printable(text[-ERROR_LIMIT:])
