"""Cancelling jobs: ``tether job cancel``, ``job cancel-status`` and ``job cancellations``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

import typer
from rich.text import Text

from tether import display
from tether.app import DEFAULT_CANCEL_WAIT
from tether.cancellation import CancellationRecord, CancellationResult
from tether.cli.common import (
    AppOpt,
    DatabaseOpt,
    JobIdArg,
    JsonOpt,
    LimitOpt,
    OffsetOpt,
    fail,
    friendly,
    now_utc,
    open_app,
    run,
)
from tether.cli.output import Cell, Column, details, listing, out, print_json, table, watching
from tether.job import Job
from tether.states import JobState

RECORD_STYLES = {"completed": "green", "partial": "yellow", "failed": "red", "skipped": "grey50"}
"""How a cancellation record's status (and each step's) is coloured."""


@friendly
def job_cancel(
    job_id: JobIdArg,
    reason: Annotated[
        str | None, typer.Option(help="Recorded with the cancellation.", show_default=False)
    ] = None,
    force: Annotated[
        bool,
        typer.Option(help="Stop a running job at once, without its grace period."),
    ] = False,
    cascade: Annotated[
        bool, typer.Option(help="Also cancel the jobs it spawned that have not finished.")
    ] = True,
    wait: Annotated[
        float,
        typer.Option(min=0, help="Seconds to wait for a running job to stop (0: do not wait)."),
    ] = DEFAULT_CANCEL_WAIT,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a job: at once if it is not running, else ask its worker to stop it.

    Exits 0 once the job is cancelled (or already was, or finished first, or is still
    stopping), 1 if it succeeded already or does not exist.
    """
    app = open_app(database, app_ref)

    async def go() -> tuple[Job, CancellationResult]:
        before = await app.get(job_id)
        async with watching(app, job_id, "Cancelling", enabled=not as_json):
            return before, await app.cancel(
                job_id, reason=reason, force=force, cascade=cascade, wait=wait, actor=app.actor
            )

    before, res = run(app, go())
    if before.state is JobState.CANCELLED and res.outcome == "cancelled":
        # A repeated request shares the first one's record, which says "cancelled";
        # the person asking now wants to know that it was so before they asked.
        res = dataclasses.replace(res, outcome="already_cancelled")
    if as_json:
        print_json(res)
        return
    if res.outcome == "already_cancelled":
        # Replaying the first cancellation's steps would read as if they happened now.
        out.print(_already_cancelled(res))
        return
    out.print(Text(f"Cancelling job {before.id} ({before.task})", style="bold"))
    out.print(f"Reason: {reason or 'cancelled by request'}")
    if res.steps:
        out.print()
        out.print("Progress:")
        for line in _progress_lines(res):
            out.print(line)
        out.print()
        out.print("Summary:")
        out.print(f"- Tasks completed: {len(res.tasks_completed)}")
        out.print(f"- Tasks cancelled: {len(res.tasks_cancelled)}")
        if res.tasks_failed:
            out.print(f"- Tasks failed: {len(res.tasks_failed)}")
        if res.dependents_blocked:
            blocked = ", ".join(map(str, res.dependents_blocked))
            out.print(f"- Dependents left blocked: {blocked}")
        out.print(f"- Runners terminated: {len(res.runners_terminated)}")
        out.print(f"- Duration: {res.duration_seconds:.2f}s")
        out.print()
    out.print(_cancel_message(res))
    for problem in res.errors if res.outcome != "requested" else res.errors[1:]:
        out.print(Text(f"  note: {problem}", style="yellow"))
    if res.cancellation_id:
        out.print(f"Cancellation ID: {res.cancellation_id}")
        out.print(f"Status: {res.status.upper()}")


def _already_cancelled(res: CancellationResult) -> Text:
    """The answer to cancelling a job that was cancelled before: which cancellation, when."""
    when = res.steps[0].started_at if res.steps else None
    about = " ".join(
        x
        for x in (
            f"cancellation {res.cancellation_id}" if res.cancellation_id else "",
            f"at {when}" if when else "",
        )
        if x
    )
    return Text(
        f"job {res.job.id} was already cancelled" + (f" ({about})" if about else ""),
        style="yellow",
    )


def _progress_lines(res: CancellationResult) -> list[Text]:
    """The record's steps as people read them: ✓ done, ✗ failed, - nothing to do."""
    marks = {"completed": ("✓", "green"), "failed": ("✗", "red"), "skipped": ("-", "dim")}
    lines = []
    for step in res.steps:
        mark, style = marks.get(step.status, ("?", "yellow"))
        d = step.details
        if step.name == "request":
            text = f"Stopped task assignment ({d.get('state_before')} → {d.get('state_after')})"
        elif step.name == "stop_runners":
            runners = d.get("runners_terminated", [])
            if step.status == "skipped":
                text = "No runner was active"
            elif runners or step.status == "failed":
                # An abandoned handler ignored the request and may still be running:
                # calling it terminated would claim more than happened.
                left = [r for r in runners if r.endswith("(abandoned)")]
                stopped = [r for r in runners if r not in left]
                if left:
                    lines.append(
                        Text(
                            f"✗ Abandoned {len(left)} handler(s) that ignored cancellation "
                            f"(they may still run, but nothing they write counts): "
                            f"{', '.join(left)}",
                            style="yellow",
                        )
                    )
                if left and not stopped and step.status != "failed":
                    continue
                text = f"Terminated {len(stopped)} runner(s)" + (
                    f": {', '.join(stopped)}" if stopped else ""
                )
            else:
                text = "No runner to stop: the job ended before the request reached it"
        elif step.name == "update_tasks":
            text = (
                f"Cancelled {len(d.get('cancelled', []))} task(s); "
                f"kept {len(d.get('completed', []))} completed"
            )
        elif step.name == "clean_resources":
            lines.append(
                Text(f"{mark} Released {len(d.get('slots_released', []))} slot(s)", style=style)
            )
            text = f"Preserved {len(d.get('artifacts_preserved', []))} artifact(s)"
        elif step.name == "dismiss":
            text = "Dismissed the failed job (failed → cancelled)"
        elif step.name == "follow_up":
            ended = ", ".join(f"job {i} {state}" for i, state in d.get("ended", {}).items())
            text = f"Followed up once the job(s) stopped: {ended}"
        elif step.name == "settle_from_job_states":
            ended = ", ".join(f"job {i} {state}" for i, state in d.get("ended", {}).items())
            text = f"Settled from the job states ({d.get('why')}): {ended or 'none ended'}"
        else:
            text = step.name
        if step.error:
            text += f" — {step.error}"
        lines.append(Text(f"{mark} {text}", style=style))
    return lines


def _cancel_message(res: CancellationResult) -> Text:
    j = res.job
    if res.outcome == "cancelled":
        return Text(f"job {j.id} cancelled", style="green")
    if res.outcome == "already_cancelled":
        return Text(f"job {j.id} was already cancelled", style="yellow")
    if res.outcome == "finished_first":
        return Text(
            f"job {j.id} {j.state.value} before it saw the cancel request; its result stands",
            style="yellow",
        )
    if res.outcome == "failed_over_budget":
        return Text(
            f"job {j.id} was paused over its budget, so it failed instead of being cancelled",
            style="yellow",
        )
    # Still running: the service's first error says why and what happens next.
    detail = res.errors[0] if res.errors else "its worker will stop it; it will not run again"
    return Text(f"job {j.id} is {j.display_state}: {detail}", style="yellow")


@friendly
def job_cancel_status(
    job_id: JobIdArg,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a job's cancellation record: its steps, what it stopped, and any errors."""
    app = open_app(database, app_ref)
    record = run(app, app.cancellations.get(job_id))
    if record is None:
        fail(f"job {job_id} has no cancellation record")
    if as_json:
        print_json(record)
        return
    out.print(details(_record_fields(record, now_utc())))
    steps = table(
        [
            Column(col, overflow="fold", no_wrap=col in ("step", "status"))
            for col in ("step", "status", "details", "error")
        ],
        (
            (
                step.name,
                Text(step.status, style=RECORD_STYLES.get(step.status, "")),
                json.dumps(step.details) if step.details else "",
                Text(step.error or "", style="red"),
            )
            for step in record.steps
        ),
        title="steps",
    )
    out.print()
    out.print(steps)


def _record_fields(record: CancellationRecord, now: datetime) -> Iterator[tuple[str, Cell]]:
    """The head of ``job cancel-status``: who asked, when, and what the record says."""
    yield "cancellation", record.id
    yield "job", str(record.job_id)
    yield "status", Text(record.status, style=RECORD_STYLES.get(record.status, ""))
    yield "reason", record.reason or "-"
    yield "force / cascade", f"{record.force} / {record.cascade}"
    yield (
        "initiated",
        (f"{display.age(record.initiated_at, now)} ago by {record.initiated_by or 'unknown'}"),
    )
    if record.completed_at is not None:
        took = (record.completed_at - record.initiated_at).total_seconds()
        yield "completed", f"{display.age(record.completed_at, now)} ago, took {took:.2f}s"
    for name, value in (record.result.to_json() if record.result else {}).items():
        if value and name not in ("errors", "duration_seconds"):
            yield name.replace("_", " "), json.dumps(value)
    if record.error:
        yield "error", Text(record.error, style="red")


@friendly
def job_cancellations(
    limit: LimitOpt = 20,
    offset: OffsetOpt = 0,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List cancellations, newest first."""
    app = open_app(database, app_ref)
    records = run(app, app.cancellations.list(limit, offset))
    now = now_utc()
    listing(
        records,
        [
            Column(col, no_wrap=col != "reason")
            for col in ("id", "job", "status", "by", "age", "reason")
        ],
        lambda r: (
            r.id,
            str(r.job_id),
            Text(r.status, style=RECORD_STYLES.get(r.status, "")),
            r.initiated_by or "",
            display.age(r.initiated_at, now),
            r.reason or "",
        ),
        as_json=as_json,
        empty="no cancellations",
    )
