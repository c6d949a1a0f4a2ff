"""The demo: a document pipeline (crawl → chunk → embed → upsert) watched live.

``tether demo`` runs workers in-process on a fresh SQLite file, enqueues a dozen crawls
and shows every job in the terminal as it runs, retries, fails, or is cancelled.

The package is also an ordinary tether app. While a demo runs (or after you stopped it
with Ctrl-C and it released its running jobs), another terminal in the same directory
can join in (after ``make demo`` in a clone of tether, the command is
``.venv/bin/tether``, or run ``source .venv/bin/activate`` first)::

    tether worker --app tether.demo:app        # resumes released jobs from checkpoints
    tether enqueue crawl --app tether.demo:app --args '{"url": "https://example.org/x"}'
    tether job list --app tether.demo:app

Nothing in ``import tether`` loads this package; ``tether demo`` imports it when it runs.
Its modules: :mod:`~tether.demo.pipeline` (the app and its simulated tasks),
:mod:`~tether.demo.session` (workers, feed, live view, summary),
:mod:`~tether.demo.server` (the dashboard next to it) and :mod:`~tether.demo.command`
(how another terminal reaches ``tether``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from tether import display
from tether.demo.command import find_tether_command
from tether.demo.pipeline import DEMO_DATABASE_URL, app
from tether.demo.server import DEMO_PORT
from tether.demo.session import DemoRun
from tether.facades import Admin

__all__ = ["DEMO_DATABASE_URL", "DEMO_PORT", "app", "main"]


def _fresh_sqlite(url: str) -> None:
    """Delete the demo's SQLite file (and its WAL files) and make sure its folder exists."""
    path = Path(url.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def main(
    *,
    database: str | None = None,
    duration: float | None = None,
    workers: int = 2,
    concurrency: int = 3,
    console: Console | None = None,
    port: int | None = DEMO_PORT,
) -> int:
    """Run the demo; returns the process exit code.

    Without ``database`` it uses a fresh ``.tether/demo.db``. A database you name is
    used as it is, and the view shows only the jobs created during this run.
    """
    console = console or Console()
    url = database or DEMO_DATABASE_URL
    Admin.sqlite_file(url)  # a malformed URL fails here, before anything is deleted
    if database is None:
        _fresh_sqlite(url)
    app.url = url  # the store is created lazily from it, so this is before first use
    demo = DemoRun(
        app=app,
        console=console,
        database=display.redact_url(url),
        duration=duration,
        n_workers=workers,
        concurrency=concurrency,
        web_port=port,
        interactive=console.is_terminal and not console.is_dumb_terminal,
        tether=find_tether_command(),
    )

    async def go() -> int:
        try:
            return await demo.run()
        finally:
            await app.close()

    try:
        return asyncio.run(go())
    finally:
        # ``embed`` enqueues through the blocking API, whose store lives on the App's
        # background loop; close it there.
        app.run_sync(app.close())
