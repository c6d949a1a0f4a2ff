"""The :class:`Worker`: composes the claimer, heartbeater, completer, handler threads and
maintenance services, runs the claimed jobs, and owns the lifecycle (start, graceful
stop) and hint forwarding. What an attempt's end means is decided in
:mod:`tether.worker.outcome`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import secrets
import signal
from typing import TYPE_CHECKING, Any

from tether import hints as h
from tether import logcapture, metrics
from tether.children import children
from tether.config import WorkerConfig
from tether.context import CURRENT, JobContext
from tether.durable import Parked, Steps, UserConnections
from tether.errors import ConfigError, InvalidJobError, LeaseLostError
from tether.executors import Handle, ThreadHandle, start_handler, thread_of
from tether.hooks import OutcomeEvent, OutcomeKind
from tether.job import Beat, Job, JobFilter, NewJob, Outcome
from tether.logs import job_fields
from tether.maintenance import Maintenance, build_maintenance
from tether.new_job import checked_meta, new_job
from tether.procinfo import hostname, start_time
from tether.service import Service
from tether.states import JobState
from tether.store import Store
from tether.task import EnqueueOptions
from tether.worker.claimer import Claimer
from tether.worker.completer import Completer
from tether.worker.heartbeater import Heartbeater
from tether.worker.logbook import Logbook
from tether.worker.outcome import Attempt, Ending, decide, unfit_arguments, unstarted
from tether.worker.ramp import Ramp
from tether.worker.run import Run, beat
from tether.worker.threads import EXIT_RESTART, HandlerThreads

if TYPE_CHECKING:
    from tether.host import Host

# Every part of the worker logs as ``tether.worker``: operators filter on that one name.
log = logging.getLogger("tether.worker")

#: The signals that stop a worker: the first gracefully, a second at once. SIGHUP is
#: among them because a closed terminal or a supervisor's reload sends it, and Python's
#: default for it would kill the process without releasing its jobs.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


#: The outcome hooks hear of, by the state an attempt ended in.
_OUTCOME_KINDS: dict[JobState, OutcomeKind] = {
    JobState.SUCCEEDED: "succeeded",
    JobState.RETRYING: "failed",
    JobState.FAILED: "exhausted",
    JobState.CANCELLED: "cancelled",
}


class Worker:
    """Runs the jobs of one :class:`~tether.App`; its parts are described in
    :mod:`tether.worker`."""

    def __init__(self, app: Host, config: WorkerConfig) -> None:
        if not app.tasks:
            raise ConfigError("the app has no tasks registered; a worker would claim nothing")
        self.app = app
        self.config = config
        self.host = hostname()
        self.pid = os.getpid()
        self.id = f"{self.host}:{self.pid}:{secrets.token_hex(3)}"
        self.task_names = sorted(app.tasks)
        #: Handlers at once (``config.concurrency``, or its default for these tasks).
        self.concurrency = config.slots(t.executor for t in app.tasks.values())
        self.running: dict[int, Run] = {}
        self.stopping = False
        self._store: Store | None = None
        self.threads = HandlerThreads(
            self,
            tasks=app.tasks,
            concurrency=self.concurrency,
            max_abandoned=config.max_abandoned_threads,
            record=lambda abandoned, full: self.store.set_worker_threads(self.id, abandoned, full),
        )
        #: The connections its handlers' fenced transactions borrow (PostgreSQL).
        self.connections = UserConnections(app.url, self.concurrency)
        #: What the process should exit with: EXIT_RESTART once it stopped itself.
        self.exit_code = 0
        self._services: list[Service] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._done = asyncio.Event()
        self._stop_task: asyncio.Task[None] | None = None
        self._stop_started = False
        # Stop requests made before start() had finished (see request_stop).
        self._stops_pending = 0
        self._started = False
        self._hard = asyncio.Event()
        #: Outcome hooks still running (awaited, bounded, at stop).
        self._telling: set[asyncio.Task[None]] = set()
        #: Handlers that have not ended yet (``running`` also holds jobs whose outcome
        #: is still being written).
        self.executing = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.claimer: Claimer
        self.heartbeater: Heartbeater
        self.completer: Completer
        self.logbook: Logbook
        self._capturing = False
        self.maintenance: Maintenance

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
        await self._store.listen()
        await self._store.register_worker(
            self.id,
            self.config.name,
            self.host,
            self.pid,
            start_time(self.pid),
            self.config.queues,
            self.concurrency,
            tasks=self.task_names,
            schedules=sorted(self.app.schedules.declared),
        )
        self._assemble(self._store)
        self.maintenance = build_maintenance(self.app, self._store, self.id, self.config)
        await self._open()
        self._services = [self.completer, self.heartbeater, self.claimer, self.logbook]
        logcapture.install()  # records logged inside handlers go to their jobs' logs
        self._capturing = True
        log.info(
            "worker %s started: queues=%s concurrency=%d tasks=%s",
            self.id,
            ",".join(self.config.queues),
            self.concurrency,
            ",".join(self.task_names),
        )
        if services:
            # The completer runs even when the other services are driven by hand: a
            # finishing job waits on it.
            for svc in self._services:
                self._tasks.append(asyncio.create_task(svc.run(), name=f"tether-{svc.name}"))
            self._tasks += self.maintenance.start()
            self._tasks.append(asyncio.create_task(self._forward_hints(), name="tether-hints"))
        else:
            self._tasks.append(asyncio.create_task(self.completer.run(), name="tether-completer"))
        # No await from here on: a stop requested while starting is pending now, and
        # any later one finds the worker started.
        self._started = True
        for _ in range(min(self._stops_pending, 2)):
            self.request_stop()

    def _assemble(self, store: Store) -> None:
        """Build the parts that run the jobs, each given what it may touch."""
        self.heartbeater = Heartbeater(
            store,
            self.id,
            self.config,
            self,
            claiming=lambda: not self.claimer.idle.is_set(),
            report_threads=self.threads.report,
            recovered=self._database_back,
        )
        self.claimer = Claimer(
            store,
            self.id,
            self.config,
            self,
            tasks=self.task_names,
            healthy=lambda: self.heartbeater.healthy,
            room=self.threads.room,
            unthreaded=self.threads.unthreaded_task_names,
        )
        # Unlike the maintenance services, the completer needs no lock_wait: its
        # statement skips held job rows, and the transition's limit and workflow updates
        # bound their own waits in SQL.
        self.logbook = Logbook(
            store,
            max_lines=self.app.config.job_log_max_lines,
            max_bytes=self.app.config.job_log_max_bytes,
            loop=asyncio.get_running_loop(),
        )
        self.completer = Completer(store, self.id, logbook=self.logbook)

    async def _open(self) -> None:
        """A graceful opening: recover orphans first, then (if set) start gradually.

        Orphans are jobs still leased by dead workers, including this host's previous
        incarnation of this worker; recovered jobs with a checkpoint go back to their
        place in line, ahead of newer work.
        """
        try:
            recovered = await self.maintenance.rescuer.run_once()
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
        """Start and run until :meth:`stop` (or SIGTERM/SIGINT/SIGHUP with ``handle_signals``).

        A stop requested before the start (see :meth:`request_stop`) returns at once,
        without registering; one requested while starting takes effect as soon as the
        worker has started.
        """
        if handle_signals:
            # One handler for the worker's whole life, installed before anything else:
            # request_stop() itself knows whether the worker has started yet, so no
            # signal can fall between two handlers.
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self.request_stop)
        if self._stops_pending:
            log.info("stopped before starting: nothing was registered")
            return
        await self.start()
        await self._done.wait()

    def request_stop(self) -> None:
        """First call: graceful stop. Second call: stop at once.

        Safe at any moment, also from a signal handler: before :meth:`start` has
        finished, the request is kept, and :meth:`start` acts on it as its last step.
        """
        if not self._started:
            self._stops_pending += 1
            log.info("stop requested before the worker has started; kept until it has")
            return
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
        if self._telling:  # outcome hooks of the last jobs, bounded like the handlers
            _, late = await asyncio.wait(self._telling, timeout=grace)
            for telling in late:
                log.warning("an outcome hook still runs at the worker's stop; cancelling it")
                telling.cancel()
        with contextlib.suppress(Exception):
            # Lines still pending: of jobs whose outcome could not be written yet, whose
            # leases still hold.
            await self.logbook.run_once()
        if self._capturing:
            self._capturing = False
            logcapture.uninstall()
        for svc in self._services:
            svc.stop()
        self.maintenance.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.maintenance.leader.resign()  # another worker leads at its next round
        with contextlib.suppress(Exception):
            await self.store.set_worker_state(self.id, "stopped")
        await self.threads.flush()  # no report of the pool's state outlives the worker
        self.threads.pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(Exception):
            await self.connections.close()
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
            unstarted(job, "released at worker shutdown (claimed as the stop began; not started)")
        )

    async def found(self, count: int) -> None:
        """A claim round came back with ``count`` jobs: tell the store whether this
        worker is idle (see ``WorkerStore.worker_idle``)."""
        await self.store.worker_idle(self.id, count == 0 and not self.running)

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
                if self.completer.pending:
                    # Rows held by someone else: not in a tight loop.
                    await asyncio.sleep(0.2)
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
        concurrency = self.concurrency
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
            children=lambda: children(self.store, job.id),
            max_payload_bytes=self.app.config.max_payload_bytes,
            max_artifact_bytes=self.app.config.max_artifact_bytes,
            threaded=task.executor == "thread",
            write_log=self.logbook.add,
            steps=lambda: Steps(
                job,
                self.store,
                worker_id=self.id,
                url=self.app.url,
                connections=self.connections,
                on_lease_lost=lambda: self._lease_lost(job.id),
                usage=lambda: ctx.usage,
                max_payload_bytes=self.app.config.max_payload_bytes,
                stop_requested=lambda: ctx.cancelled.reason if ctx.cancelled else None,
            ),
        )
        loop = asyncio.get_running_loop()
        run = Run(job, task, ctx)
        run.began = loop.time()
        run.leased_at = run.began if leased_at is None else leased_at
        self.running[job.id] = run
        self.executing += 1
        self._idle.clear()
        metrics.job_started(job)
        if log.isEnabledFor(logging.DEBUG):  # its fields cost more than the job when off
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
                raise unfit_arguments(unfit)
            current = CURRENT.set(ctx)  # the handler's task (or thread) starts with it
            try:
                run.handle = start_handler(
                    task,
                    ctx,
                    self.threads.pool,
                    grace=self.config.cancel_grace,
                    kill_timeout=self.config.kill_timeout,
                    hooks=self.app.hooks,
                    on_start=functools.partial(self._handler_started, run),
                    on_signal=functools.partial(self._signalled, run),
                )
            finally:
                CURRENT.reset(current)
        except Exception as exc:  # e.g. args the handler does not take: a failed attempt
            self._settle(run, "error", exc)
            return
        run.handle.future.add_done_callback(functools.partial(self._handler_done, run))
        if job.timeout:
            run.timers.append(loop.call_later(job.timeout, self._time_out, run))

    def _handler_started(self, run: Run, handle: Handle) -> None:
        """``run``'s handler started in ``handle`` (a thread one holds a pool thread)."""
        if isinstance(handle, ThreadHandle) and not run.settled:
            self.threads.taken(run, handle.thread)
            run.timers.append(
                asyncio.get_running_loop().call_later(
                    self.config.handler_start_timeout, self._check_started, run
                )
            )

    # -- the thread pool -----------------------------------------------------------------

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

    def _lease_lost(self, job_id: int) -> None:
        run = self.running.get(job_id)
        if run is not None:
            self.interrupt(run, "lease_lost")

    async def _spawn(self, parent: Job, task: str, args: dict[str, Any]) -> Job:
        new = dataclasses.replace(
            new_job(
                self.app.tasks,
                task,
                args,
                EnqueueOptions(),
                max_payload_bytes=self.app.config.max_payload_bytes,
            ),
            parent_id=parent.id,
        )

        async def insert(checked: list[NewJob]) -> list[Job]:
            child = await self.store.spawn(parent.id, parent.lease_token, checked[0])
            if child is None:
                # Refused because of a pending cancel or a lost lease: the heartbeat
                # tells which, and the job ends accordingly. Only this spawn fails here.
                raise LeaseLostError(
                    f"job {parent.id} can no longer spawn children: it was cancelled, "
                    "deleted or lost its lease"
                )
            return [child]

        (child,) = await self.app.hooks.enqueue([new], insert, checked_meta)
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

    def _settle(self, run: Run, kind: Ending, value: Any) -> None:
        """The handler ended (or was abandoned): free its slot and record the outcome."""
        if run.settled:
            return
        run.settled = True
        self.executing -= 1
        for timer in run.timers:
            timer.cancel()
        thread = thread_of(run.handle)
        if thread is not None and not thread.done():
            self.threads.abandon(run)
        job = run.job
        try:
            outcome = self._outcome(run, kind, value)
            metrics.job_ran(
                job.task,
                outcome,
                asyncio.get_running_loop().time() - run.began,
                parked=isinstance(value, Parked),
            )
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
            self.completer.submit(outcome, functools.partial(self._recorded, run, outcome))
        except Exception:
            log.exception("job %s: internal error in the worker", job.id)
            self._forget(run)
        finally:
            self.claim_more()

    def _recorded(self, run: Run, outcome: Outcome, accepted: bool) -> None:
        job = run.job
        self._forget(run)
        if accepted and self.app.hooks.hears_outcomes:
            self._tell(run, outcome)
        if accepted:
            level = logging.DEBUG if outcome.state is JobState.SUCCEEDED else logging.INFO
            if not log.isEnabledFor(level):
                return
            duration = asyncio.get_running_loop().time() - run.began
            reason = outcome.reason
            if outcome.state in (JobState.CANCELLED, JobState.PAUSED) and run.reason:
                reason = run.reason
            elif outcome.error and outcome.state in (JobState.FAILED, JobState.RETRYING):
                # The error's last line (its message, after any traceback) says why.
                reason = outcome.error.strip().splitlines()[-1][:300]
            log.log(
                level,
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
                    cancellation_id=run.cancellation_id,
                ),
            )
        else:
            metrics.lease_lost()
            log.warning("job %s: lease lost before its outcome was recorded", job.id)

    def _tell(self, run: Run, outcome: Outcome) -> None:
        """Tell the outcome hooks how ``run``'s job ended (not a release or a pause:
        the job goes on)."""
        kind = _OUTCOME_KINDS.get(outcome.state)
        if kind is None:
            return
        job = dataclasses.replace(
            run.job,
            state=outcome.state,
            error=outcome.error,
            stopped_by=outcome.stopped_by or run.job.stopped_by,
        )
        reason = run.reason if kind == "cancelled" else outcome.reason
        event = OutcomeEvent(
            kind, job, error=outcome.error, reason=reason, cancellation_id=run.cancellation_id
        )

        async def tell() -> None:
            if kind == "cancelled" and event.cancellation_id is None:
                found = await self._cancellation_id(job.id)
                await self.app.hooks.outcome(dataclasses.replace(event, cancellation_id=found))
            else:
                await self.app.hooks.outcome(event)

        telling = asyncio.ensure_future(tell())
        self._telling.add(telling)
        telling.add_done_callback(self._telling.discard)

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
            now = found.get(run.job.id)
            if now is not None:
                run.reason = now.cancel_reason if kind == "cancel" else now.pause_reason
        # After the reasons are kept: the job may end (and log its end) meanwhile.
        for run, kind in new:
            if kind == "cancel":
                run.cancellation_id = await self._cancellation_id(run.job.id)
            run.ctx.cancelled.describe(run.reason, run.cancellation_id)
        for run, kind in new:
            job, now = run.job, found.get(run.job.id)
            force = kind == "cancel" and now is not None and now.cancel_force
            log.info(
                "job %s (%s) attempt %d: %s requested%s: %s%s",
                job.id,
                job.task,
                job.attempt,
                kind,
                " (force)" if force else "",
                run.reason or "no reason given",
                f" ({run.cancellation_id})" if kind == "cancel" and run.cancellation_id else "",
                extra=job_fields(
                    f"{kind}_requested",
                    job_id=job.id,
                    task=job.task,
                    queue=job.queue,
                    attempt=job.attempt,
                    reason=run.reason,
                    worker_id=self.id,
                    cancellation_id=run.cancellation_id if kind == "cancel" else None,
                ),
            )

    async def _cancellation_id(self, job_id: int) -> str | None:
        """The id of the job's cancellation record, for the log; ``None`` if it is not
        written yet (it follows the request the worker heard of) or cannot be read."""
        try:
            record = await self.store.get_cancellation(job_id=job_id, request_id=None)
        except Exception as exc:  # as above: the log must not cost the heartbeat
            log.debug("could not read the cancellation of job %s: %s", job_id, exc)
            return None
        return record.id if record is not None else None

    def _forget(self, run: Run) -> None:
        if self.running.get(run.job.id) is run:
            del self.running[run.job.id]
        if not self.running:
            self._idle.set()
        self.claim_more()

    def claim_more(self) -> None:
        """A slot or a pool thread came free: claim again now, unless stopping."""
        if not self.stopping:
            self.claimer.wake()

    def restart(self) -> None:
        """Stop gracefully, for the supervisor to start a fresh worker in this one's
        place (the process exits with :data:`~tether.worker.threads.EXIT_RESTART`)."""
        self.exit_code = EXIT_RESTART
        self.request_stop()

    def _database_back(self) -> None:
        """The database answers the heartbeat again: the loops that were backing off
        try again now."""
        for svc in self._services:
            if svc is not self.heartbeater:
                svc.wake()
        self.maintenance.wake()

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
        if run.task.executor != "process":  # a process's signals are logged as sent
            how = "its task cancelled" if run.task.executor == "async" else "abandoned"
            self._log_stop(run, how, "handler_stopped")
        handle.stop(force)
        loop = asyncio.get_running_loop()
        run.timers.append(loop.call_later(handle.abandon_after, self._abandon, run))

    def _signalled(self, run: Run, name: str, pid: int) -> None:
        self._log_stop(run, f"{name} sent to process {pid}", "signal_sent", signal=name, pid=pid)

    def _log_stop(self, run: Run, how: str, event: str, **fields: Any) -> None:
        """Log at INFO how a handler is being stopped, and why: the interrupt (cancel,
        pause, shutdown, lease_lost, timeout) with the request's reason and the
        cancellation's id where known."""
        job = run.job
        why = "timeout" if run.timed_out else (run.interrupt or "stop")
        log.info(
            "job %s (%s) attempt %d: %s (%s%s%s)",
            job.id,
            job.task,
            job.attempt,
            how,
            why,
            f": {run.reason}" if run.reason else "",
            f", {run.cancellation_id}" if run.cancellation_id else "",
            extra=job_fields(
                event,
                job_id=job.id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
                interrupt=why,
                reason=run.reason,
                cancellation_id=run.cancellation_id,
                worker_id=self.id,
                **fields,
            ),
        )

    def _abandon(self, run: Run) -> None:
        if not run.settled:
            log.warning("job %s ignored being stopped; abandoning it", run.job.id)
            if run.handle is not None:
                run.handle.stopped_by = "abandoned"
            self._settle(run, "cancelled", None)

    def _outcome(self, run: Run, kind: Ending, value: Any) -> Outcome | None:
        return decide(
            Attempt(
                run.job,
                run.task.retry,
                kind,
                value,
                interrupt=run.interrupt,
                detail=run.detail,
                stopped_by_us=run.stopped_by_us,
                stopped_by=run.handle.stopped_by if run.handle else None,
                timed_out=run.timed_out,
                stopping=run.ctx.stopping.is_set(),
            ),
            max_payload_bytes=self.app.config.max_payload_bytes,
            handler_start_timeout=self.config.handler_start_timeout,
        )

    # -- for tests and tools -------------------------------------------------------------

    def beats(self) -> list[Beat]:
        """The leases the next heartbeat would extend."""
        return [beat(r) for r in self.beating()]

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no job runs on this worker (for tests and the demo)."""
        async with asyncio.timeout(timeout):
            await self._idle.wait()
