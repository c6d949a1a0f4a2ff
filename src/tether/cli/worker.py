"""``tether worker`` runs jobs; ``tether workers`` lists who runs them."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Annotated

import typer
from rich.text import Text

from tether import display
from tether.app import App
from tether.cli.common import (
    EXIT_USAGE,
    AppOpt,
    DatabaseOpt,
    JsonOpt,
    LogLevelOpt,
    PoolSizeOpt,
    fail,
    friendly,
    now_utc,
    open_app,
    parse_log_level,
    run,
    set_pool_size,
)
from tether.cli.maintenance import retention_from
from tether.cli.output import Cell, Column, listing, out
from tether.config import ASYNC_CONCURRENCY, THREAD_CONCURRENCY, WorkerConfig
from tether.job import WorkerInfo
from tether.logs import JsonFormatter
from tether.ops import LeaderInfo
from tether.worker import Worker
from tether.worker.worker import STOP_SIGNALS


@friendly
def worker(
    app_ref: Annotated[
        str,
        typer.Option(
            "--app",
            "-a",
            metavar="MODULE:ATTR",
            envvar="TETHER_APP",
            help="The tether.App whose tasks to run, e.g. myproject.jobs:app.",
            show_default=False,
        ),
    ],
    database: DatabaseOpt = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            "-c",
            min=1,
            help=f"Jobs run at the same time. Default: {ASYNC_CONCURRENCY} when every task "
            f"is async, else {THREAD_CONCURRENCY}.",
            show_default=False,
        ),
    ] = WorkerConfig.concurrency,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            help="A queue to take jobs from (repeatable). Default: every queue the app's "
            "tasks use.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="A name shown by `tether workers`.", show_default=False)
    ] = None,
    stop_timeout: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds running jobs get to finish after SIGTERM before they are released.",
        ),
    ] = WorkerConfig.stop_timeout,
    lease: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds a job's lease lasts without a heartbeat; a worker that vanishes has "
            "its jobs run again about this long after. At least 2 x --heartbeat + 2.",
        ),
    ] = WorkerConfig.lease_duration,
    heartbeat: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds between heartbeats, which extend the leases."),
    ] = WorkerConfig.heartbeat_interval,
    cancel_grace: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds an async handler has, after ctx.cancelled is set, before it gets "
            "CancelledError.",
        ),
    ] = WorkerConfig.cancel_grace,
    ramp_window: Annotated[
        float,
        typer.Option(
            min=0,
            help="Open the worker's slots gradually over this many seconds after it starts "
            "(0: all at once).",
        ),
    ] = WorkerConfig.ramp_window,
    max_abandoned_threads: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Stop gracefully (exit code 75, for the supervisor to restart the worker) "
            "once more than this many thread handlers that ignored being stopped still run. "
            "Default: no limit; a full thread pool only stops thread jobs being claimed.",
            show_default=False,
        ),
    ] = None,
    log_level: LogLevelOpt = "info",
    log_format: Annotated[
        str,
        typer.Option(
            help="text (for people) or json (one JSON object per line, for log collectors)."
        ),
    ] = "text",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=1, max=65535, help="Serve Prometheus metrics on this port.", show_default=False
        ),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="Address for --metrics-port.")] = "127.0.0.1",
    retain: Annotated[
        list[str] | None,
        typer.Option(
            "--retain",
            metavar="KIND=AGE",
            help="Keep finished rows this long before the maintenance leader prunes them "
            "(repeatable): KIND is succeeded, failed, cancelled, audit or workers; AGE is "
            "like 12h or 7d, or 'forever'. Defaults: the app's retention (succeeded=1d, "
            "failed=7d, cancelled=7d, audit=90d, workers=7d).",
            show_default=False,
        ),
    ] = None,
    pool_size: PoolSizeOpt = None,
) -> None:
    """Run jobs until SIGTERM, SIGHUP or Ctrl-C.

    The first signal stops claiming and gives running jobs --stop-timeout seconds; what
    still runs then goes back to the queue with its checkpoint, without spending an
    attempt. A second signal releases them at once.
    """
    # A signal before the worker exists leaves at once: nothing is registered or held
    # yet. (Python's defaults would kill the process on SIGTERM and print a traceback
    # on SIGINT.)
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    _on_stop_signal(_exit_before_start)
    try:
        level = parse_log_level(log_level)
        if log_format not in ("text", "json"):
            fail(f"unknown --log-format {log_format!r}: use text or json", EXIT_USAGE)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            JsonFormatter()
            if log_format == "json"
            else logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        )
        logging.basicConfig(level=level, handlers=[handler])
        # A long-running worker logs every connection failure, with its timestamp.
        logging.getLogger("psycopg.pool").propagate = True
        app = open_app(database, app_ref, create=True)
        if retain:
            app.config = dataclasses.replace(
                app.config, retention=retention_from(app.config.retention, retain)
            )
        set_pool_size(app, pool_size)
        queues = tuple(dict.fromkeys(queue)) if queue else _app_queues(app)
        config = WorkerConfig(
            concurrency=concurrency,
            queues=queues,
            name=name,
            stop_timeout=stop_timeout,
            max_abandoned_threads=max_abandoned_threads,
            lease_duration=lease,
            heartbeat_interval=heartbeat,
            cancel_grace=cancel_grace,
            ramp_window=ramp_window,
        )
        w = Worker(app, config)
        # From here a signal is a stop request: one made before run() installs its own
        # handler is kept by the worker, which then does not start. (Python runs a signal
        # caught meanwhile through the old handler before it installs the new one.)
        _on_stop_signal(lambda signum, frame: w.request_stop())
        if metrics_port is not None:
            _serve_metrics(metrics_host, metrics_port)
        logging.getLogger("tether.cli").info("database %s", display.redact_url(app.url))
        run(app, w.run(handle_signals=True))
    except BaseException:
        # Failed (or called in-process, as by tests): leave the handlers as they were.
        for sig, old in previous.items():
            signal.signal(sig, old)
        raise
    # The loop's close put the default handlers back; the worker has stopped, so a late
    # signal must not turn a clean exit into a kill.
    _on_stop_signal(signal.SIG_IGN)
    # Thread handlers cannot be interrupted: one that ignored its cancel request is
    # abandoned (its lease settled, its writes fenced off) but its thread runs on.
    # Those threads are not daemons, so a normal exit would join them and the process
    # could hang forever after the worker has already stopped. Everything the worker
    # owed the database is written by now, so flush our output and leave at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(w.exit_code)


def _on_stop_signal(handler: signal.Handlers | Callable[[int, FrameType | None], None]) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)


def _exit_before_start(signum: int, frame: FrameType | None) -> None:
    logging.getLogger("tether.cli").info(
        "%s before the worker started: exiting", signal.Signals(signum).name
    )
    raise SystemExit(0)


def _app_queues(app: App) -> tuple[str, ...]:
    queues = [app.config.default_queue, *(t.queue for t in app.tasks.values())]
    return tuple(dict.fromkeys(queues))


def _serve_metrics(host: str, port: int) -> None:
    from tether import metrics

    try:
        metrics.serve(port, host)
    except OSError as exc:
        fail(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}")
    logging.getLogger("tether.cli").info("metrics on http://%s:%d/metrics", host, port)


@friendly
def workers(
    show_all: Annotated[
        bool, typer.Option("--all", help="Include stopped and dead workers.")
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List workers: active and draining ones unless --all."""
    app = open_app(database, app_ref)
    found, leader = run(app, _workers_and_leader(app))
    shown = found if show_all else [w for w in found if w.state in ("active", "draining")]
    leads = leader.holder if leader is not None and leader.active else None
    now = now_utc()
    # Only when some worker has them: hung handler threads it could not stop.
    abandoned = any(w.abandoned_threads for w in shown)
    # The facts of a worker stay on one line; its queues and tasks wrap instead.
    facts = ["id", "name", "host", "pid", "state", "running", "heartbeat", "started"]
    columns = [
        *(
            Column(col, justify="right" if col in ("pid", "running") else "left", no_wrap=True)
            for col in facts + (["abandoned"] if abandoned else [])
        ),
        Column("queues", overflow="fold"),
        Column("tasks", overflow="fold"),
    ]

    def row(w: WorkerInfo) -> list[Cell]:
        cells: list[Cell] = [
            w.id,
            w.name or "",
            w.host,
            str(w.pid),
            display.worker_state_text(w.state)
            + (Text(" ★ leader", style="bold") if w.id == leads else ""),
            str(w.running_jobs),
            display.age(w.heartbeat_at, now) + " ago",
            display.age(w.started_at, now) + " ago",
        ]
        if abandoned:
            # A full pool claims no thread jobs until the worker restarts.
            cells.append(
                Text(f"{w.abandoned_threads} threads, pool full", style="red")
                if w.thread_pool_full
                else Text(str(w.abandoned_threads or ""), style="yellow")
            )
        cells.append(",".join(w.queues))
        cells.append(", ".join(w.tasks) if w.tasks is not None else Text("?", style="grey50"))
        return cells

    listing(
        shown,
        columns,
        row,
        as_json=as_json,
        empty="no active workers",
        json_value=[{**display.to_json(w), "leader": w.id == leads} for w in shown],
    )
    if as_json:
        return
    hidden = len(found) - len(shown)
    if hidden:
        out.print(Text(f"({hidden} stopped or dead not shown; use --all)", style="grey50"))
    out.print(_leader_line(leader))


async def _workers_and_leader(app: App) -> tuple[list[WorkerInfo], LeaderInfo | None]:
    return await app.admin.workers(), await app.admin.leader()


def _leader_line(leader: LeaderInfo | None) -> Text:
    if leader is None:
        # A leader that stops gives the lead back, so no row also follows a clean stop.
        return Text(
            "maintenance leader: none (no worker has run yet, or the last leader stopped)",
            style="grey50",
        )
    if not leader.active:
        return Text(
            f"maintenance leader: none (the lease of {leader.holder} ran out; "
            "another worker takes it within seconds)",
            style="yellow",
        )
    duties = "rescues, follows up cancellations, prunes, fires schedules, releases workflow steps"
    return Text(f"maintenance leader: {leader.holder} ({duties})")
