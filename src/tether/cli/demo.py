"""``tether demo``: the command only; the demo itself (:mod:`tether.demo`) is imported
when it runs, so nothing else loads it."""

from __future__ import annotations

from typing import Annotated

import typer

from tether.cli.common import friendly
from tether.cli.output import out


@friendly
def demo(
    database: Annotated[
        str | None,
        typer.Option(
            "--database",
            "-d",
            metavar="URL",
            help="Where the demo keeps its jobs. Default: a fresh sqlite:///.tether/demo.db.",
            show_default=False,
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            min=1, help="Stop on its own after this many seconds (for CI).", show_default=False
        ),
    ] = None,
    n_workers: Annotated[
        int, typer.Option("--workers", "-w", min=1, max=16, help="In-process workers.")
    ] = 2,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Jobs each worker runs at once.")
    ] = 3,
    port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="Serve the API and dashboard on 127.0.0.1 here (a free port if taken).",
        ),
    ] = 8000,
    web: Annotated[
        bool, typer.Option("--web/--no-web", help="Serve the API and dashboard.")
    ] = True,
) -> None:
    """Watch a crawl → chunk → embed → upsert pipeline run live, with retries and a cancel.

    It also serves the API and dashboard on 127.0.0.1 and prints their URL and a fresh
    admin token (it opens nothing by itself). Ctrl-C stops it gracefully: running jobs
    are released with their checkpoints.
    """
    from tether import demo as demo_mod

    code = demo_mod.main(
        database=database,
        duration=duration,
        workers=n_workers,
        concurrency=concurrency,
        console=out,
        port=port if web else None,
    )
    raise typer.Exit(code)
