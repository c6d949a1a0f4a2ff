"""Jobs: ``tether enqueue``, ``tether stats`` and ``tether job`` (cancelling is in
:mod:`tether.cli.cancel`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

import typer
from rich.text import Text

from tether import display, job_meta, payload
from tether.cancellation import CancellationRecord
from tether.cli.cancel import RECORD_STYLES
from tether.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    AppOpt,
    DatabaseOpt,
    JobIdArg,
    JsonOpt,
    LimitOpt,
    fail,
    friendly,
    now_utc,
    open_app,
    resolve_task,
    run,
)
from tether.cli.output import Cell, Column, Row, details, listing, out, print_json, table, watching
from tether.errors import InvalidJobError
from tether.job import JSON, Job, JobEvent, StepInfo
from tether.states import JobState
from tether.task import EnqueueOptions


@friendly
def enqueue(
    task: Annotated[str, typer.Argument(help="Task name (a unique suffix like 'crawl' works).")],
    args: Annotated[
        str,
        typer.Option(
            "--args",
            help="The job's arguments as a JSON object; @FILE reads it from a file, - from stdin.",
        ),
    ] = "{}",
    app_ref: AppOpt = None,
    database: DatabaseOpt = None,
    queue: Annotated[
        str | None, typer.Option(help="Queue (default: the task's).", show_default=False)
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(help="Higher runs first (default: the task's).", show_default=False),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(help="Concurrency key: one running job per key.", show_default=False),
    ] = None,
    delay: Annotated[float, typer.Option(min=0, help="Seconds before it may run.")] = 0.0,
    max_attempts: Annotated[
        int | None, typer.Option(min=1, help="Attempts before it fails.", show_default=False)
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(help="Seconds one attempt may run (default: the task's).", show_default=False),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            help="Enqueue at most once per key; repeats return the same job.", show_default=False
        ),
    ] = None,
    meta: Annotated[
        list[str] | None,
        typer.Option(
            "--meta",
            help="A label carried with the job, KEY=VALUE (repeatable).",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Enqueue one job and print its id and state."""
    text = _read_args(args)
    if payload.text_depth_over(text):  # before the parser, whose stack could run out
        raise InvalidJobError(f"--args cannot be stored: {payload.TOO_DEEP}")
    try:
        parsed: JSON = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"--args is not valid JSON: {exc}", EXIT_USAGE)
    if not isinstance(parsed, dict):
        shown = text if len(text) <= 40 else text[:39] + "…"
        fail(f"--args must be a JSON object like '{{\"x\": 1}}', got {shown!r}", EXIT_USAGE)
    if not app_ref:
        fail("enqueue needs the app's tasks: pass --app MODULE:ATTR or set TETHER_APP", EXIT_USAGE)
    app = open_app(database, app_ref)
    name = resolve_task(app, task)
    opts = EnqueueOptions(
        queue=queue,
        priority=priority,
        key=key,
        delay=delay,
        max_attempts=max_attempts,
        timeout=timeout,
        idempotency_key=idempotency_key,
        meta=job_meta.parse_pairs(meta or ()),
    )
    job = run(app, app.enqueue(name, parsed, opts))
    if as_json:
        print_json(job)
        return
    line = Text(f"job {job.id} ")
    line.append(job.task, style="bold")
    line.append(" is ")
    line.append_text(display.state_text(job.display_state))
    if job.state.value == "queued" and job.run_at > now_utc():
        line.append(f" (runs in {display.age(now_utc(), job.run_at)})")
    out.print(line)


def _read_args(value: str) -> str:
    """``--args`` itself, or the file it names with ``@path``, or stdin for ``-``.

    Command lines are limited to about 128 KB per argument, well below the payload limit.
    """
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        try:
            with open(value[1:], encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            fail(f"cannot read --args file {value[1:]!r}: {exc.strerror}", EXIT_USAGE)
    return value


@friendly
def stats(database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False) -> None:
    """Count jobs in each state."""
    app = open_app(database, app_ref)
    counts = run(app, app.jobs.stats())
    rows: list[Row] = [
        Row((display.state_text(state), str(n)), style="" if n else "grey50")
        for state, n in counts.items()
    ]
    rows.append(Row((Text("total", style="bold"), Text(str(sum(counts.values())), style="bold"))))
    listing(rows, ["state", Column("jobs", justify="right")], lambda r: r, as_json=as_json,
            json_value=counts)  # fmt: skip


@friendly
def job_list(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state", "-s", help="Only jobs in this state (repeatable).", show_default=False
        ),
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Only this queue.", show_default=False)] = None,
    task: Annotated[str | None, typer.Option(help="Only this task.", show_default=False)] = None,
    meta: Annotated[
        list[str] | None,
        typer.Option(
            "--meta", help="Only jobs whose meta has KEY=VALUE (repeatable).", show_default=False
        ),
    ] = None,
    limit: LimitOpt = 50,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    labels = job_meta.parse_pairs(meta or ())
    app = open_app(database, app_ref)
    jobs = run(
        app,
        app.jobs.list(state=state or None, queue=queue, task=task, meta=labels, limit=limit),
    )
    now = now_utc()
    listing(
        jobs,
        [
            Column(
                col,
                justify="right" if col in ("id", "attempt", "age") else "left",
                no_wrap=col in ("id", "state", "attempt", "progress", "age"),
            )
            for col in ("id", "task", "state", "attempt", "queue", "worker", "progress", "age")
        ],
        lambda j: (
            str(j.id),
            j.task,
            display.state_text(j.display_state),
            f"{j.attempt}/{j.max_attempts}",
            j.queue,
            j.worker_id or "",
            display.job_bar(j, width=10),
            display.age(j.created_at, now),
        ),
        as_json=as_json,
        empty="no jobs",
    )


@friendly
def job_show(
    job_id: JobIdArg,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show every field of one job, its history, and its cancellation if any."""
    app = open_app(database, app_ref)

    async def fetch() -> tuple[
        Job, list[JobEvent], CancellationRecord | None, str | None, list[StepInfo]
    ]:
        job = await app.get(job_id)
        return (
            job,
            await app.jobs.events(job_id),
            await app.cancellations.get(job_id),
            await app.jobs.unserved_reason(job),
            await app.durable.steps(job_id),
        )

    job, events, cancellation, unserved, steps = run(app, fetch())
    now = now_utc()
    waits = display.waiting_for(job, steps, now)
    if as_json:
        print_json(
            {
                "job": job,
                "events": events,
                "cancellation": cancellation,
                "unserved": unserved,
                "steps": steps,
                "waiting_for": waits,
            }
        )
        return
    out.print(details(_job_fields(job, now)))
    if waits is not None:
        out.print(Text(f"⏸ {waits}", style="cyan"))
    if unserved is not None:
        out.print(Text(f"⚠ waiting forever: {unserved}", style="yellow"))
    if steps:
        out.print()
        out.print(
            table(
                [
                    Column("step", overflow="fold"),
                    Column("kind", no_wrap=True),
                    Column("state", no_wrap=True),
                    Column("attempt", justify="right"),
                    Column("took", justify="right", no_wrap=True),
                    Column("usage", justify="right"),
                    Column("result", overflow="fold"),
                ],
                (_step_row(step, now) for step in steps),
                title="steps",
            )
        )
    out.print()
    out.print(
        table(
            [
                Column("at", no_wrap=True),
                Column("transition", no_wrap=True),
                *(Column(col, overflow="fold") for col in ("worker", "actor", "reason")),
            ],
            (_event_row(ev) for ev in events),
            title="history",
        )
    )
    if cancellation is not None:
        out.print()
        line = Text("cancellation ", style="bold")
        line.append(f"{cancellation.id}: ")
        line.append(cancellation.status, style=RECORD_STYLES.get(cancellation.status, ""))
        line.append(f"  (details: tether job cancel-status {job.id})", style="grey50")
        out.print(line)


def _job_fields(job: Job, now: datetime) -> Iterator[tuple[str, Cell]]:
    """Every field of ``job`` as ``job show`` prints it; times also say how long ago."""
    for name, value in display.to_json(job).items():
        if name == "display_state":
            continue
        if name == "state":
            # As people see it: a running job with a cancel request is "cancelling".
            yield name, display.state_text(job.display_state)
            continue
        if value is None:
            text: Cell = Text("-", style="grey50")
        elif isinstance(value, dict | list):
            text = json.dumps(value)
        else:
            text = str(value)
        if name.endswith("_at") and value is not None:
            stamp = getattr(job, name)
            rel = (
                display.age(stamp, now) + " ago"
                if stamp <= now
                else "in " + display.age(now, stamp)
            )
            text = f"{value}  ({rel})"
        yield name, text


def _step_row(step: StepInfo, now: datetime) -> tuple[Cell, ...]:
    took = display.took(step.started_at, step.finished_at) if step.finished_at else ""
    if step.state == "waiting":
        ends = "wakes" if step.kind == "sleep" else "times out"
        result: Cell = Text(
            "no time limit"
            if step.wakes_at is None
            else f"{ends} {display.when(step.wakes_at, now)}",
            style="cyan",
        )
    else:
        result = display.preview(step.result, 80)
    return (
        step.name,
        step.kind,
        display.state_text(step.state),
        str(step.attempt),
        took,
        str(step.usage) if step.usage else "",
        result,
    )


@friendly
def job_signal(
    job_id: JobIdArg,
    name: Annotated[str, typer.Argument(help="The signal's name, as ctx.wait_for() names it.")],
    payload_text: Annotated[
        str,
        typer.Option(
            "--payload",
            help="The signal's payload, as JSON (e.g. '{\"approved\": true}'); "
            "@file reads a file, - reads stdin.",
        ),
    ] = "null",
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send a signal to a job that waits (or will wait) for it with ctx.wait_for().

    A job parked in its wait runs again at once; a signal sent before the wait is kept
    until the job reaches it. Sending the same signal again changes nothing.
    """
    try:
        value = json.loads(_read_args(payload_text))
    except ValueError as exc:
        raise InvalidJobError(f"--payload is not valid JSON: {exc}") from exc
    app = open_app(database, app_ref)
    answer = run(app, app.durable.signal(job_id, name, value, actor=app.actor))
    if as_json:
        print_json({"job_id": job_id, "signal": name, "answer": answer})
        return
    out.print(
        {
            "woke": f"job {job_id} was waiting for {name!r}: it runs again now",
            "kept": f"signal {name!r} kept: job {job_id} gets it when it waits for it",
            "duplicate": f"job {job_id} already had this signal {name!r}; nothing changed",
        }[answer]
    )


def _event_row(ev: JobEvent) -> tuple[Cell, ...]:
    change = Text(f"{ev.from_state.value if ev.from_state else '∅'} → ")
    change.append_text(display.state_text(ev.to_state.value))
    return (
        ev.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
        change,
        ev.worker_id or "",
        ev.actor or "",
        display.first_line(ev.reason, 120),
    )


@friendly
def job_pause(
    job_id: JobIdArg,
    reason: Annotated[
        str | None, typer.Option(help="Recorded with the pause.", show_default=False)
    ] = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause a job: at once if it waits to run, at its next checkpoint if it runs."""
    app = open_app(database, app_ref)
    job = run(app, app.jobs.pause(job_id, reason=reason, actor=app.actor))
    if as_json:
        print_json(job)
    elif job.state is JobState.PAUSED:
        out.print(Text(f"job {job.id} paused (tether job resume {job.id} continues it)"))
    else:
        out.print(Text(f"job {job.id} is {job.display_state}: it pauses at its next checkpoint"))


@friendly
def job_resume(
    job_id: JobIdArg,
    budget: Annotated[
        int | None,
        typer.Option(min=1, help="A new usage budget for the job.", show_default=False),
    ] = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Queue a paused job again; it continues from its checkpoint."""
    app = open_app(database, app_ref)
    job = run(app, app.jobs.resume(job_id, budget=budget, actor=app.actor))
    if as_json:
        print_json(job)
    elif job.state is JobState.RUNNING:
        out.print(f"job {job.id}: pause withdrawn; it keeps running")
    else:
        out.print(Text(f"job {job.id} is {job.display_state} again"))


@friendly
def job_retry(
    job_id: JobIdArg,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Queue a failed job again with a fresh set of attempts."""
    app = open_app(database, app_ref)
    job = run(app, app.jobs.retry(job_id, actor=app.actor))
    if as_json:
        print_json(job)
    else:
        out.print(f"job {job.id} is {job.display_state} again with {job.max_attempts} attempts")


@friendly
def job_delete(
    job_id: JobIdArg,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a job. Its active children are cancelled first ("parent job deleted");
    children that already finished are kept."""
    app = open_app(database, app_ref)
    children = run(app, app.jobs.delete(job_id, actor=app.actor))
    if as_json:
        print_json({"deleted": job_id, "children_cancelled": [c.id for c in children]})
        return
    out.print(f"job {job_id} deleted")
    if children:
        out.print(
            f"cancelled {len(children)} active child job(s): "
            + ", ".join(str(c.id) for c in children)
        )


@friendly
def job_wait(
    job_id: JobIdArg,
    timeout: Annotated[
        float | None,
        typer.Option(min=0, help="Give up after this many seconds.", show_default=False),
    ] = None,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Wait until a job succeeds, fails or is cancelled; exit 0 only if it succeeded."""
    app = open_app(database, app_ref)

    async def go() -> Job:
        async with watching(app, job_id, "Waiting for"):
            return await app.wait(job_id, timeout)

    job = run(app, go())
    line = Text(f"job {job.id} ")
    line.append_text(display.state_text(job.display_state))
    if job.error:
        line.append(f": {display.first_line(job.error, 200)}")
    out.print(line)
    if job.state.value != "succeeded":
        raise typer.Exit(EXIT_FAILED)
