"""``tether audit``: the audit log."""

from __future__ import annotations

from rich.text import Text

from tether.cli.common import (
    AppOpt,
    DatabaseOpt,
    JsonOpt,
    LimitOpt,
    OffsetOpt,
    friendly,
    open_app,
    run,
)
from tether.cli.output import Column, listing


@friendly
def audit(
    limit: LimitOpt = 50,
    offset: OffsetOpt = 0,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the audit log, newest first: every change and every denied attempt."""
    from tether.audit import Audit

    app = open_app(database, app_ref)
    rows = run(app, Audit(app).list(limit, offset))
    listing(
        rows,
        [
            Column(col, overflow="fold", no_wrap=col in ("at", "result"))
            for col in ("at", "actor", "action", "target", "result", "request", "detail")
        ],
        lambda row: (
            row.at.strftime("%Y-%m-%d %H:%M:%S"),
            row.actor,
            row.action,
            row.target or "",
            Text(row.result, style="green" if row.result == "ok" else "red"),
            row.request_id or "",
            row.detail or "",
        ),
        as_json=as_json,
        empty="the audit log is empty",
    )
