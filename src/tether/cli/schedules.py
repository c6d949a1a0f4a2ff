"""Periodic schedules: ``tether schedule list``, ``pause``, ``resume`` and ``remove``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.text import Text

from tether import display
from tether.cli.common import AppOpt, DatabaseOpt, JsonOpt, friendly, now_utc, open_app, run
from tether.cli.output import Column, listing, out

ScheduleArg = Annotated[str, typer.Argument(help="The schedule's name (see `schedule list`).")]


@friendly
def schedule_list(
    database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False
) -> None:
    """List schedules with their next tick, the last tick dealt with, the last job, and
    how many live workers declare each (the leader fires every schedule listed, declared
    or not; `schedule remove` deletes one that no worker declares any more).

    With --app, the app's schedules are listed even before a worker has seen them.
    """
    app = open_app(database, app_ref)
    rows = run(app, app.schedules.list())
    now = now_utc()

    def stamp(at: datetime | None, future: bool = False) -> str:
        if at is None:
            return "-"
        span = display.duration(abs((at - now).total_seconds()))
        return f"{at.strftime('%Y-%m-%d %H:%M:%S')} ({'in ' + span if future else span + ' ago'})"

    listing(
        rows,
        [
            Column(col, overflow="fold")
            for col in (
                "name",
                "cron",
                "tz",
                "state",
                "next run",
                "last tick",
                "last run",
                "last job",
                "declared by",
            )
        ],
        lambda r: (
            r.name,
            r.cron,
            r.timezone,
            Text("paused", style="yellow") if r.paused else Text("active", style="green"),
            "-" if r.paused else stamp(r.next_tick, future=True),
            stamp(r.last_tick),
            stamp(r.last_run_at),
            str(r.last_job_id) if r.last_job_id is not None else "-",
            _declared(r.declared_by),
        ),
        as_json=as_json,
        empty="no schedules (declare them with @app.periodic(cron=...))",
    )


@friendly
def schedule_pause(
    name: ScheduleArg,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Stop enqueueing a schedule's ticks; ticks that pass meanwhile are skipped."""
    app = open_app(database, app_ref)
    run(app, app.schedules.pause(name))
    out.print(f"[green]✓[/] schedule {escape(name)} paused")


@friendly
def schedule_resume(
    name: ScheduleArg,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Enqueue a paused schedule's ticks again, from its next tick on."""
    app = open_app(database, app_ref)
    run(app, app.schedules.resume(name))
    out.print(f"[green]✓[/] schedule {escape(name)} resumed")


def _declared(workers: int | None) -> Text:
    if not workers:
        return Text("no live worker", style="yellow")
    return Text(f"{workers} worker{'s' if workers > 1 else ''}")


@friendly
def schedule_remove(
    name: ScheduleArg,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Delete a schedule: the maintenance leader fires it no more.

    A worker whose app still declares it records it again when it starts, so remove it
    from the code first.
    """
    app = open_app(database, app_ref)
    still = run(app, app.schedules.remove(name))
    out.print(f"[green]✓[/] schedule {escape(name)} removed")
    if still:
        out.print(
            f"[yellow]![/] {still} live worker(s) still declare it: it comes back when one "
            "of them restarts; remove it from their code"
        )
