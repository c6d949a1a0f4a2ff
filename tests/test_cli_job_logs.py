"""``tether job logs ID [--follow]`` against a real SQLite file: a worker's lines are
written through the store as a worker writes them, and the follower, a real process,
prints each one as it comes and exits when the job has finished."""

from __future__ import annotations

import json
import queue
import subprocess
import threading

from typer.testing import CliRunner

from tests.test_cli import (
    TETHER,
    _enqueue,
    _env,
    assert_one_line_error,
    claim_one,
    runner,  # noqa: F401 (a fixture)
    succeed,
    tether,
    with_store,
)
from tether.job import Job
from tether.joblog import PendingLine
from tether.store import Store

BOUNDS = {"max_lines": 3, "max_bytes": 10_000}


def write(url: str, job: Job, *messages: str, level: str = "info") -> None:
    lines = [PendingLine(1_700_000_000.0 + i, level, m) for i, m in enumerate(messages)]

    async def go(store: Store) -> bool:
        return await store.append_logs(job.id, job.lease_token, lines, **BOUNDS)

    assert with_store(url, go)


def test_job_logs_prints_the_lines_in_order(runner: CliRunner, sqlite_url: str) -> None:  # noqa: F811
    (job,) = _enqueue(sqlite_url, 1)
    claimed = claim_one(sqlite_url)
    empty = tether(runner, "job", "logs", str(job.id), "-d", sqlite_url)
    assert empty.exit_code == 0, empty.output
    assert f"job {job.id} has logged nothing" in empty.stdout

    write(sqlite_url, claimed, "fetching [bold]page[/bold] 1", "fetched")
    write(sqlite_url, claimed, "slow page", level="warning")
    write(sqlite_url, claimed, "more", "and more")  # past the bound of 3 lines
    shown = tether(runner, "job", "logs", str(job.id), "-d", sqlite_url)
    assert shown.exit_code == 0, shown.output
    printed = shown.stdout.splitlines()
    assert len(printed) == 4
    assert printed[0].endswith("info     fetching [bold]page[/bold] 1")  # not markup
    assert " #1 " in printed[0] and printed[0].startswith("2023-11-14 22:13:20.000")
    assert printed[2].endswith("warning  slow page")
    assert "dropped" in printed[3] and "2 more line(s) dropped" in printed[3]

    data = tether(runner, "job", "logs", str(job.id), "-d", sqlite_url, "--json")
    rows = [json.loads(x) for x in data.stdout.splitlines()]
    assert [(r["seq"], r["level"]) for r in rows] == [
        (1, "info"),
        (2, "info"),
        (3, "warning"),
        (4, "dropped"),
    ]
    assert rows[3]["dropped"] == 2

    assert_one_line_error(tether(runner, "job", "logs", "999", "-d", sqlite_url), 1, "999")


def test_job_logs_follow_prints_a_running_jobs_lines_and_ends_with_it(sqlite_url: str) -> None:
    (job,) = _enqueue(sqlite_url, 1)
    claimed = claim_one(sqlite_url)
    write(sqlite_url, claimed, "first")
    proc = subprocess.Popen(
        [TETHER, "job", "logs", str(job.id), "--follow", "-d", sqlite_url],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    printed: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            printed.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert printed.get(timeout=20).rstrip().endswith("first")
        write(sqlite_url, claimed, "second")  # written while the follower runs
        assert printed.get(timeout=20).rstrip().endswith("second")
        assert proc.poll() is None  # the job still runs: it keeps following
        succeed(sqlite_url, claimed)
        assert proc.wait(timeout=20) == 0, proc.stderr.read() if proc.stderr else ""
        reader.join(timeout=20)
        assert printed.empty()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
