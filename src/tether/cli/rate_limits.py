"""Rate limits: ``tether rate-limit set``, ``rate-limit remove`` and ``rate-limit list``."""

from __future__ import annotations

from typing import Annotated

import typer

from tether.cli.common import (
    AppOpt,
    DatabaseOpt,
    JsonOpt,
    fail,
    friendly,
    open_app,
    resolve_task,
    run,
)
from tether.cli.output import Column, listing, out

QueueTarget = Annotated[
    str | None, typer.Option("--queue", help="Limit this queue's jobs.", show_default=False)
]


TaskTarget = Annotated[
    str | None,
    typer.Option("--task", help="Limit this task's jobs, on every queue.", show_default=False),
]


@friendly
def rate_limit_set(
    per_second: Annotated[
        float,
        typer.Option(help="Jobs that may start per second, on average.", show_default=False),
    ],
    queue: QueueTarget = None,
    task: TaskTarget = None,
    burst: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Jobs that may start at once after a quiet spell (default: per-second, "
            "rounded up).",
            show_default=False,
        ),
    ] = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Limit how fast jobs of a queue (--queue) or a task (--task) start."""
    app = open_app(database, app_ref)
    if task is not None:
        task = resolve_task(app, task)
    run(app, app.queues.rate_limit(queue=queue, task=task, per_second=per_second, burst=burst))
    target = f"queue {queue}" if queue is not None else f"task {task}"
    shown = burst if burst is not None else "default"
    out.print(f"{target}: at most {per_second:g} job(s)/s, bursts of {shown}")


@friendly
def rate_limit_remove(
    queue: QueueTarget = None,
    task: TaskTarget = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Drop the rate limit of a queue (--queue) or a task (--task)."""
    app = open_app(database, app_ref)
    target = f"queue {queue}" if queue is not None else f"task {task}"
    if not run(app, app.queues.remove_rate_limit(queue=queue, task=task)):
        fail(f"{target} has no rate limit")
    out.print(f"{target}: no rate limit")


@friendly
def rate_limit_list(
    database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False
) -> None:
    """List rate limits with the tokens (jobs that may start now) each holds."""
    app = open_app(database, app_ref)
    limits = run(app, app.queues.rate_limits())
    listing(
        limits,
        [
            Column(col, justify="right" if col in ("per second", "burst") else "left")
            for col in ("scope", "name", "per second", "burst", "may start now")
        ],
        lambda r: (r.scope, r.name, f"{r.per_second:g}", str(r.burst), str(int(r.tokens))),
        as_json=as_json,
        empty="no rate limits",
    )
