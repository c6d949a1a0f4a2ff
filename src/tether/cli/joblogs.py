"""``tether job logs ID [--follow]``: the lines a job's handler logged (``ctx.log``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

import typer
from rich.text import Text

from tether import display
from tether.app import App
from tether.cli.common import AppOpt, DatabaseOpt, JobIdArg, JsonOpt, friendly, open_app, run
from tether.cli.output import out
from tether.joblog import DROPPED, LogLine
from tether.states import TERMINAL

#: Seconds between two reads while following: a worker writes a job's lines within
#: 0.2 s (tether.worker.logbook), so a line shows well within a second.
FOLLOW_POLL = 0.25
#: Lines read per round trip.
PAGE = 500
LEVEL_STYLES = {
    "debug": "grey50",
    "warning": "yellow",
    "error": "red",
    "critical": "bold red",
    DROPPED: "magenta",
}


async def lines_of(app: App, job_id: int, *, follow: bool) -> AsyncIterator[LogLine]:
    """The job's lines in order; with ``follow``, new ones as they are written, until
    the job has finished (its lines are all written before its outcome)."""
    after = 0
    while True:
        # The state first: once it is final, the lines read next are all there are.
        done = (await app.get(job_id)).state in TERMINAL or not follow
        while True:
            page = await app.jobs.logs(job_id, after=after, limit=PAGE)
            for line in page:
                yield line
            if page:
                after = page[-1].seq
            if len(page) < PAGE:
                break
        if done:
            return
        await asyncio.sleep(FOLLOW_POLL)


def _text(line: LogLine) -> Text:
    text = Text(line.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], style="grey50")
    text.append(f" #{line.attempt} ", style="grey50")
    text.append(f"{line.level:<8}", style=LEVEL_STYLES.get(line.level, ""))
    text.append(" ")
    text.append(line.message)  # the handler's text, never read as markup
    return text


@friendly
def job_logs(
    job_id: JobIdArg,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep printing new lines as the job writes them, until it has finished.",
        ),
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the lines a job's handler logged (ctx.log, or the logging module inside the
    handler), oldest first: time (UTC), attempt, level, message.

    A job keeps its first lines only (AppConfig.job_log_max_lines and job_log_max_bytes);
    a last line of level 'dropped' counts the rest. With --json, one JSON object per line.
    """
    app = open_app(database, app_ref)

    async def go() -> int:
        await app.get(job_id)  # an unknown job is an error, not an empty log
        printed = 0
        async for line in lines_of(app, job_id, follow=follow):
            if as_json:
                typer.echo(json.dumps(display.to_json(line)))
            else:
                out.print(_text(line), soft_wrap=True)
            out.file.flush()
            printed += 1
        return printed

    if not run(app, go()) and not as_json and not follow:
        out.print(Text(f"job {job_id} has logged nothing", style="grey50"))
