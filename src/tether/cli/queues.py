"""Queues: ``tether queue list``, ``queue pause`` and ``queue resume``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from tether import names
from tether.app import App
from tether.cli.common import AppOpt, DatabaseOpt, JsonOpt, friendly, open_app, run
from tether.cli.output import Column, listing, out
from tether.errors import InvalidJobError

# The job counts `queue list` shows for each queue, in this order.
_COUNTED = ("queued", "running", "retrying", "paused", "failed")


@friendly
def queue_list(
    database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False
) -> None:
    """List queues with their jobs by state and whether they are paused."""
    app = open_app(database, app_ref)
    queues = run(app, app.queues.list())
    listing(
        queues,
        ["queue", "paused", *(Column(state, justify="right") for state in _COUNTED)],
        lambda q: (
            q.name,
            Text(f"yes ({q.reason})" if q.paused and q.reason else "yes", style="yellow")
            if q.paused
            else "",
            *(str(q.counts.get(s, 0)) for s in _COUNTED),
        ),
        as_json=as_json,
        empty="no queues",
    )
    if as_json:
        return
    for q in queues:
        for u in q.unserved:
            note = f"⚠ queue {q.name}: {u.jobs} waiting job(s): {u.reason}"
            out.print(Text(note, style="yellow"))


@friendly
def queue_pause(
    name: Annotated[str, typer.Argument(help="The queue.", show_default=False)],
    reason: Annotated[
        str | None, typer.Option(help="Why (shown by `tether queue list`).", show_default=False)
    ] = None,
    create: Annotated[
        bool,
        typer.Option(help="Pause a queue that has never been seen (no jobs, no worker) too."),
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Stop workers from claiming from a queue; running jobs finish."""
    app = open_app(database, app_ref)

    async def go() -> None:
        # An unsafe name is refused (and audited) by the App itself, before any lookup.
        if not create and names.is_safe(name):
            await _known_queue(app, name)
        await app.queues.pause(name, reason=reason)

    run(app, go())
    out.print(f"queue {name} paused: no new claims; running jobs finish")


@friendly
def queue_resume(
    name: Annotated[str, typer.Argument(help="The queue.", show_default=False)],
    create: Annotated[
        bool, typer.Option(help="Accept a queue that has never been seen (no jobs, no worker).")
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Let workers claim from a paused queue again."""
    app = open_app(database, app_ref)

    async def go() -> None:
        # An unsafe name is refused (and audited) by the App itself, before any lookup.
        if not create and names.is_safe(name):
            await _known_queue(app, name)
        await app.queues.resume(name)

    run(app, go())
    out.print(f"queue {name} resumed")


async def _known_queue(app: App, name: str) -> None:
    """Refuse a queue that has no jobs, no pause flag and no worker: most likely a typo."""
    known = {q.name for q in await app.queues.list()}
    known |= {q for w in await app.admin.workers() for q in w.queues}
    if name not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise InvalidJobError(
            f"queue {name!r} has never been seen (known queues: {listed}); "
            "use --create to pause or resume it anyway"
        )
