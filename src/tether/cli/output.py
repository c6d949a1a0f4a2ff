"""How commands print: the two consoles, JSON, and the one way to build a table.

Every listing command hands :func:`listing` its rows and column specs; ``--json`` prints
the same data as JSON instead. Key-value blocks (``job show``, ``job cancel-status``) go
through :func:`details`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tether import display
from tether.errors import TetherError

if TYPE_CHECKING:
    from rich.console import JustifyMethod, OverflowMethod

    from tether.app import App

T = TypeVar("T")

# How often `job cancel` and `job wait` refresh the job's state while they wait.
LIVE_REFRESH = 0.5

# Consoles look up sys.stdout/sys.stderr at write time, so test runners that swap them
# still capture the output.
# Piped output is not cut to 80 columns (a pid or a task name must survive `| grep`).
out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True, highlight=False)

Cell = str | Text
"""What a table cell holds: plain text, or text with its own style."""


@dataclass(frozen=True)
class Column:
    """One column of a table: its header and how its cells are laid out (Rich's terms)."""

    header: str
    justify: JustifyMethod = "left"
    no_wrap: bool = False
    overflow: OverflowMethod = "ellipsis"


@dataclass(frozen=True)
class Row:
    """A row with a style of its own (e.g. grey for a zero count)."""

    cells: Sequence[Cell]
    style: str = ""


def table(
    columns: Iterable[Column | str],
    rows: Iterable[Sequence[Cell] | Row],
    *,
    title: str | None = None,
) -> Table:
    """A borderless table with bold headers: every table the command prints."""
    result = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
    for col in columns:
        spec = Column(col) if isinstance(col, str) else col
        result.add_column(
            spec.header, justify=spec.justify, no_wrap=spec.no_wrap, overflow=spec.overflow
        )
    for row in rows:
        if isinstance(row, Row):
            result.add_row(*row.cells, style=row.style or None)
        else:
            result.add_row(*row)
    return result


def listing(
    items: Sequence[T],
    columns: Iterable[Column | str],
    row: Callable[[T], Sequence[Cell] | Row],
    *,
    as_json: bool,
    empty: str | None = None,
    json_value: Any = None,
) -> None:
    """Print ``items``: as JSON with ``--json`` (``json_value`` if given, else the items
    themselves), else ``empty`` when there are none, else a table of ``row(item)``."""
    if as_json:
        print_json(items if json_value is None else json_value)
    elif not items and empty is not None:
        out.print(empty)
    else:
        out.print(table(columns, (row(item) for item in items)))


def details(rows: Iterable[tuple[str, Cell]]) -> Table:
    """A block of ``name  value`` lines, names in bold, long values folded."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for name, value in rows:
        grid.add_row(name, value)
    return grid


def print_json(value: Any) -> None:
    """Write JSON to stdout exactly (no Rich wrapping or highlighting)."""
    typer.echo(json.dumps(display.to_json(value), indent=2, sort_keys=False))


@contextlib.asynccontextmanager
async def watching(app: App, job_id: int, doing: str, enabled: bool = True) -> AsyncIterator[None]:
    """While the body runs, show a spinner on stderr with the job's state and the time
    waited so far (only on a terminal: piped output stays clean)."""
    if not enabled or not err.is_terminal:
        yield
        return
    started = time.monotonic()
    with err.status(f"{doing} job {job_id}") as status:

        async def refresh() -> None:
            while True:
                try:
                    state = (await app.get(job_id)).display_state
                except TetherError:
                    state = "?"
                waited = time.monotonic() - started
                status.update(f"{doing} job {job_id}: {state} ({waited:.0f}s)")
                await asyncio.sleep(LIVE_REFRESH)

        task = asyncio.create_task(refresh())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
