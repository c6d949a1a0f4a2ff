"""Keeping the database: ``tether migrate`` and ``tether prune`` (and ``--retain``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated

import typer
from rich.text import Text

from tether.cli.common import AppOpt, DatabaseOpt, JsonOpt, friendly, open_app, run
from tether.cli.output import Column, err, listing, out
from tether.config import RetentionConfig, parse_age
from tether.errors import ConfigError
from tether.ops import PruneReport


@friendly
def migrate(database: DatabaseOpt = None, app_ref: AppOpt = None) -> None:
    """Create or upgrade tether's tables (workers and producers also do it on first use)."""
    app = open_app(database, app_ref, create=True)
    applied = run(app, app.admin.migrate())
    if applied:
        out.print(f"applied migrations: {', '.join(str(v) for v in applied)}")
    else:
        out.print("database is up to date")


@friendly
def prune(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="AGE",
            help="Prune finished jobs older than this (e.g. 12h, 7d) instead of each "
            "state's retention.",
            show_default=False,
        ),
    ] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            "-s",
            help="Only jobs in this final state: succeeded, failed or cancelled "
            "(repeatable). Audit and worker rows are then left alone.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would go; delete nothing.")
    ] = False,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete finished jobs, old audit rows and gone workers now, in small batches.

    Without options this applies the app's retention (succeeded 1 day, failed and
    cancelled 7 days, audit 90 days, stopped and dead workers 7 days), as the workers'
    maintenance leader does every minute. A job goes with its events, dependency links,
    artifacts and cancellation records; jobs in a workflow with an active member, or
    with a failed member not yet old enough to prune (it may be retried), stay.
    """
    age = parse_age(older_than) if older_than is not None else None
    app = open_app(database, app_ref)
    verb = "would delete" if dry_run else "deleted"
    shown = [0.0]

    def progress(what: str, report: PruneReport) -> None:
        # At most a line a second: a big backlog takes hundreds of batches.
        if not as_json and time.monotonic() - shown[0] >= 1.0:
            shown[0] = time.monotonic()
            err.print(
                Text(
                    f"{what}: {report.counts.get('jobs', 0)} jobs, {report.total} rows so far",
                    style="grey50",
                )
            )

    pruning = app.admin.prune(older_than=age, states=state, dry_run=dry_run, progress=progress)
    report = run(app, pruning)
    listing(
        list(report.counts.items()),
        ["kind", Column(verb, justify="right")],
        lambda count: (count[0], str(count[1])),
        as_json=as_json,
        json_value={"dry_run": dry_run, "counts": report.counts, "kept": report.kept},
    )
    if report.kept and not as_json:
        out.print(
            Text(f"{report.kept} old job(s) kept: their workflow is still active", style="grey50")
        )


def retention_from(base: RetentionConfig, specs: list[str]) -> RetentionConfig:
    """``base`` with ``KIND=AGE`` overrides (``AGE`` may be ``forever``)."""
    kinds = ("succeeded", "failed", "cancelled", "audit", "workers")
    changes: dict[str, float | None] = {}
    for spec in specs:
        kind, sep, age = spec.partition("=")
        kind = kind.strip().lower()
        if not sep or kind not in kinds:
            raise ConfigError(
                f"bad --retain {spec!r}: use KIND=AGE with KIND one of {', '.join(kinds)}"
            )
        changes[kind] = None if age.strip().lower() == "forever" else parse_age(age)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
