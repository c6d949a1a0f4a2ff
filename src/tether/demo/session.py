"""One ``tether demo`` session: its workers, the jobs it feeds them, the live view and
the summary."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tether import display
from tether.app import App
from tether.cancellation import CancellationResult
from tether.config import WorkerConfig
from tether.demo.command import TetherCommand
from tether.demo.pipeline import (
    DEMO_DATABASE_URL,
    MORE_SITES,
    SITES,
    crawl,
    digest,
    site_pages,
)
from tether.demo.server import DEMO_PORT, WebServer, free_port
from tether.errors import StoreError
from tether.job import Job
from tether.worker import Worker
from tether.workflow import Workflow


@dataclass
class Note:
    """One line of the event log."""

    at: float
    text: Text


@dataclass
class DemoRun:
    """One ``tether demo`` session: workers, sample jobs, the view, the summary."""

    app: App
    console: Console
    database: str
    duration: float | None
    n_workers: int
    concurrency: int
    interactive: bool
    t0: float = 0.0
    baseline: int = 0
    phase: str = "running"
    jobs: list[Job] = field(default_factory=list)
    seen: dict[int, tuple[str, int]] = field(default_factory=dict)
    notes: deque[Note] = field(default_factory=lambda: deque(maxlen=200))
    workers: list[Worker] = field(default_factory=list)
    stop_requests: int = 0
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_done: CancellationResult | None = None
    cancel_target: int | None = None
    cancel_seconds: float = 0.0
    web_port: int | None = DEMO_PORT
    web_url: str | None = None
    web_token: str | None = None
    tether: TetherCommand = field(default_factory=TetherCommand)

    # -- lifecycle -------------------------------------------------------------------------

    def elapsed(self) -> float:
        """Seconds since the demo started."""
        return asyncio.get_running_loop().time() - self.t0

    async def run(self) -> int:
        """Run the demo until Ctrl-C (or ``duration``); returns the exit code."""
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        await self.app.admin.listen()  # connect and migrate now: a bad database fails here
        newest = await self.app.jobs.list(limit=1)
        self.baseline = newest[0].id if newest else 0
        for i in range(self.n_workers):
            cfg = WorkerConfig(
                name=f"demo-{i + 1}",
                concurrency=self.concurrency,
                queues=("default",),
                poll_interval=0.5,
                # Progress travels with heartbeats: beat often so the bars move smoothly.
                heartbeat_interval=0.5,
                lease_duration=5.0,
                # Ctrl-C should feel prompt: jobs get 2 s, then go back with checkpoints.
                stop_timeout=2.0,
                cancel_grace=1.0,
            )
            w = Worker(self.app, cfg)
            await w.start()
            self.workers.append(w)
        web = await self.start_web() if self.web_port is not None else None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        log_handler = _NoteHandler(self)
        logging.getLogger("tether").addHandler(log_handler)
        try:
            if self.web_url is not None:
                self.console.print(
                    Text.assemble(
                        ("dashboard and API: ", "bold"),
                        (self.web_url, "bold cyan"),
                        "  (open it yourself; nothing opens on its own)\n",
                        ("admin token: ", "bold"),
                        (self.web_token or "", "bold yellow"),
                        "  (paste it on the login page, or send it as Authorization: Bearer)",
                    ),
                    soft_wrap=True,
                )
            if self.interactive:
                with Live(
                    self.render(), console=self.console, refresh_per_second=8, transient=False
                ) as live:
                    await self.drive(lambda: live.update(self.render()))
            else:
                self.console.print(
                    f"tether demo: {self.n_workers} workers x {self.concurrency} on "
                    f"{self.database}" + (f" for {self.duration:g}s" if self.duration else "")
                )
                await self.drive(lambda: None)
        finally:
            logging.getLogger("tether").removeHandler(log_handler)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if web is not None:
                await web.stop()
        self.print_summary()
        return 0

    async def start_web(self) -> WebServer | None:
        """Serve the API and dashboard on 127.0.0.1 with a fresh admin token."""
        from tether.audit import Audit
        from tether.auth import Tokens

        tokens = Tokens(self.app)
        names = {t.name for t in await tokens.list() if t.revoked_at is None}
        name = "demo-admin"
        n = 1
        while name in names:
            n += 1
            name = f"demo-admin-{n}"
        self.web_token, _ = await tokens.create(name, "admin")
        await Audit(self.app).record(
            "demo", "token.create", f"token:{name}", "ok", detail="role admin"
        )
        server = WebServer(self.app, free_port(self.web_port or DEMO_PORT))
        await server.start()
        self.web_url = f"http://127.0.0.1:{server.port}/"
        return server

    async def drive(self, refresh: Callable[[], None]) -> None:
        """Feed jobs and refresh the view until asked to stop; then stop the workers."""
        feeder = asyncio.create_task(self.feed())
        try:
            deadline = self.duration
            while not self.stop_event.is_set():
                await self.poll()
                refresh()
                if deadline is not None and self.elapsed() >= deadline:
                    self.note("duration reached: stopping", "bold")
                    self.request_stop()
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), 0.25)
            self.phase = "stopping"
            feeder.cancel()
            stopping = asyncio.gather(*(w.stop() for w in self.workers))
            while not stopping.done():
                await self.poll()
                refresh()
                await asyncio.wait([stopping], timeout=0.25)
            await stopping
            self.phase = "stopped"
            await self.poll()
            refresh()
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder

    def request_stop(self) -> None:
        """First call (Ctrl-C, SIGTERM, duration): stop gracefully. Second: at once."""
        self.stop_requests += 1
        if self.stop_requests == 1:
            self.note(
                "stopping: running jobs get 2s, then go back to the queue with their "
                "checkpoints (Ctrl-C again: at once)",
                "bold",
            )
        else:
            self.note("second stop: releasing running jobs now", "bold")
        for w in self.workers:
            w.request_stop()
        self.stop_event.set()

    # -- what the demo does --------------------------------------------------------------

    async def feed(self) -> None:
        """Enqueue the sample crawls, cancel the long one while it runs, keep crawls coming."""
        first, later = SITES[:8], SITES[8:]
        jobs = await self.app.enqueue_many(
            [(crawl, {"url": url, "pages": pages}) for url, pages in first]
        )
        self.note(f"enqueued {len(jobs)} crawls in one transaction", "bold")
        flow = Workflow()
        flow.add("blog", crawl, {"url": "https://example.org/weekly", "pages": 4})
        flow.add("docs", crawl, {"url": "https://docs.example.org/weekly", "pages": 5})
        flow.add(
            "digest",
            digest,
            {"sections": ["news", "guides", "releases"]},
            depends_on=["blog", "docs"],
        )
        made = await self.app.enqueue_workflow(flow)
        self.note(
            f"job {made['digest'].id}: a weekly digest waits on crawls {made['blog'].id} and "
            f"{made['docs'].id}, then spawns a summary per section",
            "bold",
        )
        cancel_at = 10.0 if self.duration is None or self.duration >= 14 else self.duration / 2
        long_id = jobs[0].id
        pending = list(later)
        cancelled = False
        next_at, n = 1.5, 0
        while True:
            await asyncio.sleep(0.25)
            try:
                if self.elapsed() >= next_at:
                    gap, n = await self.arrive(pending, n)
                    next_at += gap
                if not cancelled and self.elapsed() >= cancel_at:
                    cancelled = await self.cancel_one(long_id)
            except StoreError as exc:
                self.note(f"database error (retrying): {exc}", "red")

    async def arrive(self, pending: list[tuple[str, int]], n: int) -> tuple[float, int]:
        """Enqueue the next crawl: a remaining sample, else a made-up one.

        Returns the seconds until the next arrival and how many were made up so far.
        """
        if pending:
            (url, pages), gap = pending[0], 1.5
        else:
            url, gap = MORE_SITES[(n + 1) % len(MORE_SITES)].format(n=n + 1), 3.0
            pages = site_pages(url)
        job = await crawl.enqueue(url=url, pages=pages)
        if pending:
            pending.pop(0)
        else:
            n += 1
        self.note(f"job {job.id}: a new crawl arrives for {_short(url)}")
        return gap, n

    async def cancel_one(self, preferred: int) -> bool:
        """Cancel the long crawl (or any running job) and report how it went."""
        target = await self.app.get(preferred)
        if target.display_state != "running":
            # Cancelling a queued job is instant and shows little: pick a running one.
            running = [j for j in self.jobs if j.display_state == "running"]
            if not running:
                return False  # nothing to show yet; try again shortly
            target = running[0]
        where = ""
        if target.progress_total:
            where = f" at page {target.progress_current or 0}/{target.progress_total}"
        self.note(
            f"job {target.id}: the demo cancels {target.task} {_short(target.args.get('url'))}"
            f"{where} ({target.display_state})",
            "bold yellow",
        )
        self.cancel_target = target.id
        started = asyncio.get_running_loop().time()
        res = await self.app.cancel(
            target.id, reason="demo: showing cancellation of a running job", actor="demo"
        )
        self.cancel_seconds = asyncio.get_running_loop().time() - started
        self.cancel_done = res
        style = "bold green" if res.cancelled else "bold yellow"
        self.note(
            f"job {target.id}: cancel outcome: {res.outcome.replace('_', ' ')} "
            f"after {self.cancel_seconds:.1f}s",
            style,
        )
        return True

    # -- watching ------------------------------------------------------------------------

    async def poll(self) -> None:
        """Read this run's jobs from the database and note what changed."""
        try:
            jobs = await self.app.jobs.list(limit=1000)
        except StoreError as exc:
            # The workers ride out an outage; so does the view.
            self.note(f"database error (retrying): {exc}", "red")
            return
        self.jobs = [j for j in jobs if j.id > self.baseline]
        for job in sorted(self.jobs, key=lambda j: j.id):
            self.observe(job)

    def observe(self, job: Job) -> None:
        """Turn a job's state change into an event line."""
        now = (job.display_state, job.attempt)
        before = self.seen.get(job.id)
        self.seen[job.id] = now
        if before == now or (before is None and job.state.value in ("queued", "blocked")):
            return
        who = f"job {job.id} {job.task} {_short(job.args.get('url'))}"
        state = job.display_state
        if state == "retrying":
            self.note(
                f"{who}: attempt {job.attempt}/{job.max_attempts} failed "
                f"({display.first_line(job.error, 70)}); will retry",
                "dark_orange",
            )
        elif state == "running" and job.attempt > 1 and (before is None or before[0] != state):
            resume = _checkpoint_text(job)
            self.note(f"{who}: attempt {job.attempt} starts" + (f", {resume}" if resume else ""))
        elif state == "failed":
            self.note(
                f"{who}: failed for good after {job.attempt} attempts: "
                f"{display.first_line(job.error, 70)}",
                "bold red",
            )
        elif state == "cancelled" and job.id != self.cancel_target:
            self.note(f"{who}: cancelled ({job.cancel_reason or 'no reason'})", "magenta")
        elif state == "queued" and before is not None and before[0] in ("running", "cancelling"):
            resume = _checkpoint_text(job)
            self.note(f"{who}: released to the queue" + (f", {resume}" if resume else ""))
        elif state == "succeeded" and job.task == "upsert":
            self.note(f"{who}: document indexed end to end", "green")

    def note(self, text: str, style: str = "") -> None:
        """Add a line to the event log (and print it at once when not interactive)."""
        at = self.elapsed()
        self.notes.append(Note(at, Text(text, style=style)))
        if not self.interactive:
            line = Text(f"{at:6.1f}s  ", style="grey50")
            line.append_text(Text(text, style=style))
            self.console.print(line, soft_wrap=True)

    # -- rendering -----------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """This run's jobs by displayed state."""
        counts: dict[str, int] = {}
        for job in self.jobs:
            counts[job.display_state] = counts.get(job.display_state, 0) + 1
        return counts

    def render(self) -> RenderableType:
        """The whole live view."""
        header = Text()
        header.append("tether demo", style="bold")
        header.append(
            f"  {self.n_workers} workers x {self.concurrency} slots on {self.database}  "
            f"{self.elapsed():.0f}s",
            style="grey62",
        )
        if self.duration:
            header.append(f" / {self.duration:g}s", style="grey62")
        if self.web_url:
            header.append(f"\ndashboard {self.web_url}  admin token ", style="grey62")
            header.append(self.web_token or "", style="yellow")
        header.append("  ")
        header.append(
            {
                "running": "Ctrl-C to stop gracefully",
                "stopping": "stopping: finishing or releasing running jobs…",
                "stopped": "stopped",
            }[self.phase],
            style="yellow" if self.phase != "running" else "grey62",
        )
        counts = self.counts()
        badges = Text()
        for state in display.STATE_STYLES:
            if counts.get(state):
                badges.append(f" {state} {counts[state]} ", style=display.STATE_STYLES[state])
                badges.append(" ")
        badges.append(f"total {len(self.jobs)}", style="bold")

        rows = max(5, self.console.size.height - 22)
        table = Table(box=None, header_style="bold", expand=True, pad_edge=False)
        table.add_column("id", justify="right", width=4)
        table.add_column("task", width=6)
        table.add_column("target", ratio=2, min_width=22, no_wrap=True, overflow="ellipsis")
        table.add_column("state", width=10)
        table.add_column("progress", width=20, no_wrap=True)
        table.add_column("try", justify="right", width=4)
        table.add_column("worker", width=7)
        table.add_column("note", ratio=3, no_wrap=True, overflow="ellipsis")
        shown = _ordered(self.jobs)
        for job in shown[:rows]:
            state = job.display_state
            table.add_row(
                str(job.id),
                job.task,
                _short(job.args.get("url")),
                display.state_text(state),
                display.job_bar(job, width=10),
                f"{job.attempt}/{job.max_attempts}",
                self.worker_name(job.worker_id) if state in ("running", "cancelling") else "",
                _job_note(job),
            )
        if len(shown) > rows:
            table.add_row("", "", Text(f"… {len(shown) - rows} more", style="grey50"))

        log = Text(no_wrap=True, overflow="ellipsis")
        for note in list(self.notes)[-9:]:
            log.append(f"{note.at:5.1f}s  ", style="grey50")
            log.append_text(note.text)
            log.append("\n")
        log.rstrip()
        tether = self.tether.run
        hint = Text(
            f"in another terminal: {tether} job list {self.db_option()} · "
            f"{tether} worker --app tether.demo:app {self.db_option(for_app=True)}".rstrip(),
            style="grey50",
        )
        return Group(
            header,
            badges,
            Panel(table, title="jobs (active first)", title_align="left", border_style="grey37"),
            Panel(log, title="events", title_align="left", border_style="grey37"),
            hint,
        )

    def db_option(self, *, for_app: bool = False) -> str:
        """How other commands reach this run's database."""
        if self.database == DEMO_DATABASE_URL:
            return "" if for_app else "--app tether.demo:app"
        return f"-d {self.database}"

    def worker_name(self, worker_id: str | None) -> str:
        """``demo-1`` for our workers; the raw id's tail for others."""
        for w in self.workers:
            if w.id == worker_id:
                return w.config.name or w.id
        return (worker_id or "")[-6:]

    def print_summary(self) -> None:
        """What happened, once the view is gone."""
        c = self.console
        counts = self.counts()
        c.print()
        line = Text(f"tether demo ran {self.elapsed():.1f}s: {len(self.jobs)} jobs  ", style="bold")
        for state, n in counts.items():
            line.append(f"{state} {n}  ", style=display.STATE_STYLES.get(state, ""))
        c.print(line)
        recovered = [j for j in self.jobs if j.state.value == "succeeded" and j.attempt > 1]
        if recovered:
            c.print(
                "  recovered by retrying: "
                + ", ".join(f"job {j.id} ({j.task} {_short(j.args.get('url'))})" for j in recovered)
            )
        for job in self.jobs:
            if job.state.value == "failed":
                c.print(
                    Text(
                        f"  failed: job {job.id} {job.task} {_short(job.args.get('url'))} after "
                        f"{job.attempt} attempts: {display.first_line(job.error, 90)}",
                        style="red",
                    )
                )
        if self.cancel_done is not None:
            res = self.cancel_done
            c.print(
                Text(
                    f"  cancelled while running: job {res.job.id} {res.job.task} "
                    f"{_short(res.job.args.get('url'))} ({res.outcome.replace('_', ' ')} in "
                    f"{self.cancel_seconds:.1f}s)",
                    style="magenta",
                )
            )
        released = [j for j in self.jobs if j.state.value == "queued" and j.checkpoint]
        for job in released:
            c.print(
                f"  released: job {job.id} {job.task} {_short(job.args.get('url'))}, "
                f"{_checkpoint_text(job)}"
            )
        waiting = sum(1 for j in self.jobs if not j.is_terminal)
        c.print()
        db = self.db_option()
        c.print(Text("explore:", style="bold"))
        tether = self.tether.run
        c.print(f"  {tether} job list {db}")
        if self.jobs:
            c.print(f"  {tether} job show {self.jobs[-1].id} {db}")
        if waiting:
            c.print(
                f"  {tether} worker --app tether.demo:app {self.db_option(for_app=True)}".rstrip()
                + f"   # runs the {waiting} unfinished job{'s' if waiting != 1 else ''}, "
                "resuming from checkpoints"
            )
        hint = self.tether.hint()
        if hint is not None:
            c.print(f"  {hint}")


class _NoteHandler(logging.Handler):
    """Shows tether's warnings (rescues, abandoned handlers) in the event log."""

    def __init__(self, run: DemoRun) -> None:
        super().__init__(logging.WARNING)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.run.note(f"{record.name}: {record.getMessage()}", "yellow")


def _short(url: object) -> str:
    if not isinstance(url, str):
        return ""
    return url.removeprefix("https://").removeprefix("http://").rstrip("/")


def _checkpoint_text(job: Job) -> str:
    cp = job.checkpoint
    if isinstance(cp, dict) and "next_page" in cp:
        total = cp.get("pages") or job.progress_total or "?"
        return f"resuming from its checkpoint at page {cp['next_page']}/{total}"
    return ""


def _job_note(job: Job) -> Text:
    state = job.display_state
    if state == "cancelling":
        return Text("cancel requested", style="yellow")
    if state in ("retrying", "failed"):
        return Text(display.first_line(job.error, 120), style=display.STATE_STYLES[state])
    if state == "cancelled":
        return Text(job.cancel_reason or "", style="magenta")
    if state == "succeeded" and isinstance(job.result, dict):
        return Text(", ".join(f"{k} {v}" for k, v in job.result.items()), style="grey62")
    if state == "running" and job.attempt > 1:
        return Text(f"attempt {job.attempt}, resumed from its checkpoint", style="grey62")
    if state == "queued" and job.checkpoint is not None:
        return Text(_checkpoint_text(job).replace("resuming from", "will resume from"))
    return Text("")


_ORDER = {"running": 0, "cancelling": 0, "retrying": 1, "queued": 2, "blocked": 2, "paused": 2}


def _ordered(jobs: list[Job]) -> list[Job]:
    """Active jobs first (oldest first), then finished ones (latest finished first)."""
    active = sorted(
        (j for j in jobs if not j.is_terminal), key=lambda j: (_ORDER.get(j.display_state, 3), j.id)
    )
    done = sorted(
        (j for j in jobs if j.is_terminal),
        key=lambda j: j.finished_at.timestamp() if j.finished_at else 0.0,
        reverse=True,
    )
    return active + done
