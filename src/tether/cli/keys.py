"""Concurrency keys and resource slots: ``tether key list`` and ``key configure``."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer
from rich.text import Text

from tether.cli.common import AppOpt, DatabaseOpt, JsonOpt, friendly, open_app, run
from tether.cli.output import Cell, Column, listing, out
from tether.job import LimitInfo


@friendly
def key_list(
    blocked: Annotated[
        bool, typer.Option(help="Only keys and resources that are blocked.")
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List concurrency keys and resource pools: what runs, what waits, and why it is blocked."""
    app = open_app(database, app_ref)
    found = run(app, app.queues.limits())
    limits = [lim for lim in found if not blocked or lim.blocked_reason is not None]

    def row(lim: LimitInfo) -> tuple[Cell, ...]:
        name = lim.name.split(":", 1)[1] if ":" in lim.name else lim.name
        reason = lim.blocked_reason
        return (
            name,
            lim.kind,
            str(lim.used),
            str(lim.capacity),
            str(lim.queued),
            Text(reason, style="yellow") if reason else "",
        )

    listing(
        limits,
        [
            Column(col, justify="right" if col in ("running", "capacity", "waiting") else "left")
            for col in ("name", "kind", "running", "capacity", "waiting", "blocked")
        ],
        row,
        as_json=as_json,
        empty="no blocked keys" if blocked else "no keys or resources",
        json_value=[{**dataclasses.asdict(lim), "blocked": lim.blocked_reason} for lim in limits],
    )


@friendly
def key_configure(
    key: Annotated[str, typer.Argument(help="The concurrency key.", show_default=False)],
    max_running: Annotated[
        int, typer.Option(min=1, help="Jobs of this key that may run at once.")
    ] = 1,
    block_on_hold: Annotated[
        bool, typer.Option(help="Whether a paused or failed job under the key blocks it.")
    ] = True,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Set how many jobs of a key may run at once, and whether a held job blocks it."""
    app = open_app(database, app_ref)
    run(app, app.queues.configure_key(key, max_running=max_running, block_on_hold=block_on_hold))
    out.print(f"key {key}: up to {max_running} running; blocked by held jobs: {block_on_hold}")
