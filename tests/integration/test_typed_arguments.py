"""A job's arguments are bound to its handler's signature, validated and converted."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydantic
import pytest

from tether import App, InvalidJobError, JobContext
from tether.job import NewJob


class Page(pydantic.BaseModel):
    url: str
    depth: int = 0


async def test_a_value_that_does_not_fit_the_annotation_is_refused_at_enqueue(app: App) -> None:
    @app.task(name="typed")
    async def typed(ctx: JobContext, n: int) -> int:
        return n * 2

    with pytest.raises(InvalidJobError, match="n: Input should be a valid integer"):
        await typed.enqueue(n="three")  # type: ignore[arg-type]
    assert await app.jobs.list() == []


async def test_missing_or_unknown_arguments_are_refused_at_enqueue(app: App) -> None:
    @app.task(name="crawl")
    async def crawl(ctx: JobContext, url: str, depth: int = 1) -> None:
        pass

    with pytest.raises(InvalidJobError, match="missing a required argument: 'url'"):
        await crawl.enqueue()  # type: ignore[call-arg]
    with pytest.raises(InvalidJobError, match="unexpected keyword argument 'uri'"):
        await app.enqueue("crawl", {"uri": "https://example.org"})  # the REST and CLI path
    assert await app.jobs.list() == []


async def test_models_and_dates_are_stored_as_json_and_converted_back_for_the_handler(
    app: App,
) -> None:
    seen: list[Any] = []

    @app.task(name="fetch")
    async def fetch(ctx: JobContext, page: Page, since: datetime, tags: list[str]) -> str:
        seen.extend([page, since, ctx.job.args["page"]])
        return page.url

    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    job = await fetch.enqueue(page=Page(url="https://example.org"), since=when, tags=["a"])
    assert job.args == {
        "page": {"url": "https://example.org", "depth": 0},
        "since": "2026-01-02T03:04:05Z",
        "tags": ["a"],
    }
    [done] = await app.run_until_idle()
    assert (done.state.value, done.result) == ("succeeded", "https://example.org")
    assert seen == [Page(url="https://example.org"), when, Page(url="https://example.org")]


async def test_positional_arguments_are_stored_by_name(app: App) -> None:
    @app.task(name="add")
    async def add(ctx: JobContext, a: int, b: int) -> int:
        return a + b

    job = await add.enqueue(1, b=2)
    assert job.args == {"a": 1, "b": 2}
    [done] = await app.run_until_idle()
    assert done.result == 3


async def test_arguments_that_no_longer_fit_the_handler_fail_the_job_at_once(app: App) -> None:
    @app.task(name="crawl", max_attempts=3)
    async def crawl(ctx: JobContext, url: str) -> None:
        pass

    # Enqueued against an older version of the handler, which took ``uri``.
    store = await app.store()
    [job] = await store.enqueue(
        [NewJob(task="crawl", args_json='{"uri": "https://example.org"}', queue="default")]
    )
    [done] = await app.run_until_idle()
    assert (done.id, done.state.value, done.attempt) == (job.id, "failed", 1)
    assert "unexpected keyword argument 'uri'" in (done.error or "")


SNIPPET = """
import tether

app = tether.App("sqlite:///typed.db")

@app.task
async def crawl(ctx: tether.JobContext, url: str) -> int:
    return len(url)

async def main() -> None:
    await crawl.enqueue(url="https://example.org")
    await crawl.enqueue(url=1)
    await crawl.options(priority=5).enqueue(site="x")
    crawl.enqueue_sync(url=2)
"""


def test_mypy_checks_enqueue_arguments_against_the_handler(tmp_path: Path) -> None:
    source = tmp_path / "snippet.py"
    source.write_text(textwrap.dedent(SNIPPET))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(source)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    ).stdout
    errors = [line.split(": ", 1)[1] for line in out.splitlines() if ": error:" in line]
    assert errors == [
        'error: Argument "url" to "enqueue" of "Task" has incompatible type "int"; '
        'expected "str"  [arg-type]',
        'error: Unexpected keyword argument "site" for "enqueue" of "BoundTask"  [call-arg]',
        'error: Argument "url" to "enqueue_sync" of "Task" has incompatible type "int"; '
        'expected "str"  [arg-type]',
    ], out
