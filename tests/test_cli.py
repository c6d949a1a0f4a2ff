"""The ``tether`` command, end to end against real databases.

Most tests drive the CLI in-process with Typer's runner on a SQLite file; the worker and
the demo run as real subprocesses, since they handle signals and leave with os._exit.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from tether import App, JobState
from tether.cli import cli
from tether.cli import output as cli_output
from tether.job import Job, Outcome
from tether.store import Store, create_store

T = TypeVar("T")
TETHER = str(Path(sys.executable).with_name("tether"))

APP_SOURCE = """
import asyncio
import time

from tether import App

app = App({url!r})


@app.task(name="hello")
async def hello(ctx, name="world"):
    return {{"greeting": "hello " + name}}


@app.task(name="mail.send", queue="mail")
async def send(ctx, to):
    return to


@app.task(name="stubborn", max_attempts=5)
def stubborn(ctx, seconds=60.0):
    time.sleep(seconds)  # never looks at ctx.cancelled: only abandonment stops it
"""


# -- helpers -----------------------------------------------------------------------------


def with_app(url: str, fn: Callable[[App], Awaitable[T]]) -> T:
    """Run ``fn`` against a fresh App on ``url`` (to set up or check the database)."""

    async def main() -> T:
        app = App(url)
        try:
            return await fn(app)
        finally:
            await app.close()

    return asyncio.run(main())


def with_store(url: str, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``fn`` against an open, migrated store (to put jobs in states by hand)."""

    async def main() -> T:
        store = create_store(url)
        await store.open()
        try:
            await store.migrate()
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(main())


def total_jobs(url: str) -> int:
    return sum(with_app(url, lambda a: a.jobs.stats()).values())


def claim_one(url: str) -> Job:
    """Make the oldest queued job running, leased to a newly registered fake worker."""
    worker_id = f"test-host:1:{secrets.token_hex(3)}"

    async def go(store: Store) -> Job:
        await store.register_worker(worker_id, "fake", "test-host", 1, None, ["default"], 1)
        (job,) = await store.claim(worker_id, ["default"], ["hello"], 1, 60.0)
        return job

    return with_store(url, go)


def succeed(url: str, job: Job) -> None:
    finish(url, job, Outcome(job.id, job.lease_token, JobState.SUCCEEDED, "1"))


def finish(url: str, job: Job, outcome: Outcome) -> None:
    """Record how a claimed job's attempt ended, as its worker would."""

    async def go(store: Store) -> set[int]:
        return await store.finish(job.worker_id or "", [outcome])

    assert with_store(url, go) == {job.id}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def app_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> Iterator[str]:
    """A module in the current directory defining ``app`` on ``sqlite_url``."""
    name = f"cli_app_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(APP_SOURCE.format(url=sqlite_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app prepends the cwd
    monkeypatch.delenv("TETHER_APP", raising=False)
    monkeypatch.delenv("TETHER_DATABASE_URL", raising=False)
    yield f"{name}:app"
    sys.modules.pop(name, None)


def tether(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(cli, list(args))


def assert_one_line_error(result: Result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0]
    assert "Traceback" not in result.output


# -- migrate and enqueue -----------------------------------------------------------------


def test_migrate_applies_then_reports_up_to_date(runner: CliRunner, sqlite_url: str) -> None:
    first = tether(runner, "migrate", "--database", sqlite_url)
    assert first.exit_code == 0, first.output
    assert re.fullmatch(r"applied migrations: 1(, \d+)*", first.stdout.strip())
    again = tether(runner, "migrate", "--database", sqlite_url)
    assert again.exit_code == 0
    assert "up to date" in again.stdout


def test_enqueue_prints_id_and_state_and_stores_options(
    runner: CliRunner, app_ref: str, sqlite_url: str
) -> None:
    res = tether(runner, "enqueue", "hello", "--app", app_ref, "--args", '{"name": "ada"}')
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "job 1 hello is queued"

    res = tether(
        runner, "enqueue", "send", "--app", app_ref, "--args", '{"to": "x@example.org"}',
        "--priority", "7", "--key", "tenant-1", "--max-attempts", "5", "--delay", "60",
        "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    # "send" is found by suffix; its queue comes from the task.
    assert (data["id"], data["task"], data["queue"]) == (2, "mail.send", "mail")
    assert (data["priority"], data["key"], data["max_attempts"]) == (7, "tenant-1", 5)
    job = with_app(sqlite_url, lambda a: a.get(2))
    assert job.args == {"to": "x@example.org"}
    assert (job.run_at - job.created_at).total_seconds() == pytest.approx(60, abs=1)


def test_enqueue_meta_is_shown_and_listed(runner: CliRunner, app_ref: str, sqlite_url: str) -> None:
    res = tether(runner, "enqueue", "hello", "--app", app_ref, "--meta", "env=prod",
                 "--meta", "trace=00-ab=cd", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    job_id = json.loads(res.stdout)["id"]
    assert with_app(sqlite_url, lambda a: a.get(job_id)).meta == {
        "env": "prod",
        "trace": "00-ab=cd",  # split at the first =
    }
    assert tether(runner, "enqueue", "hello", "--app", app_ref).exit_code == 0

    shown = tether(runner, "job", "show", str(job_id), "-d", sqlite_url)
    assert '{"env": "prod", "trace": "00-ab=cd"}' in shown.stdout
    data = json.loads(tether(runner, "job", "show", str(job_id), "-d", sqlite_url, "--json").stdout)
    assert data["job"]["meta"] == {"env": "prod", "trace": "00-ab=cd"}

    listed = tether(runner, "job", "list", "-d", sqlite_url, "--meta", "env=prod", "--json")
    assert [j["id"] for j in json.loads(listed.stdout)] == [job_id]
    listed = tether(runner, "job", "list", "-d", sqlite_url, "--meta", "env=dev", "--json")
    assert json.loads(listed.stdout) == []

    assert_one_line_error(
        tether(runner, "enqueue", "hello", "--app", app_ref, "--meta", "env"), 2, "key=value"
    )
    assert_one_line_error(
        tether(runner, "enqueue", "hello", "--app", app_ref, "--meta", "a b=c"), 2, "meta key"
    )
    assert total_jobs(sqlite_url) == 2


def test_enqueue_with_idempotency_key_returns_the_same_job(
    runner: CliRunner, app_ref: str, sqlite_url: str
) -> None:
    ids = []
    for _ in range(2):
        res = tether(runner, "enqueue", "hello", "--app", app_ref, "--idempotency-key", "k",
                     "--json")  # fmt: skip
        assert res.exit_code == 0, res.output
        ids.append(json.loads(res.stdout)["id"])
    assert ids[0] == ids[1]
    assert total_jobs(sqlite_url) == 1


def test_enqueue_reads_args_from_a_file_and_stdin(
    runner: CliRunner, app_ref: str, tmp_path: Path, sqlite_url: str
) -> None:
    (tmp_path / "args.json").write_text('{"name": "file"}')
    assert (
        tether(runner, "enqueue", "hello", "--app", app_ref, "--args", "@args.json").exit_code == 0
    )
    res = runner.invoke(cli, ["enqueue", "hello", "--app", app_ref, "--args", "-"],
                        input='{"name": "stdin"}')  # fmt: skip
    assert res.exit_code == 0, res.output
    jobs = with_app(sqlite_url, lambda a: a.jobs.list())
    assert sorted(j.args["name"] for j in jobs) == ["file", "stdin"]


@pytest.mark.parametrize(
    ("task", "args", "needle"),
    [
        ("hello", '{"name": ', "not valid JSON"),
        ("hello", "[1, 2]", "must be a JSON object"),
        ("hello", '{"name": NaN}', "not JSON"),
        ("nope", "{}", "unknown task 'nope'"),
        ("hello", json.dumps({"name": "x" * (1024 * 1024 + 1)}), "the limit is"),
        ("hello", '{"name": ' + "[" * 65 + "]" * 65 + "}", "nests deeper than 64 levels"),
        # Deeper than the parser's stack: refused the same way, not with a traceback.
        ("hello", '{"name": ' + "[" * 5000 + "]" * 5000 + "}", "nests deeper than 64 levels"),
    ],
    ids=["bad-json", "not-an-object", "nan", "unknown-task", "oversized", "deep", "deeper"],
)
def test_enqueue_bad_input_exits_2_and_writes_nothing(
    runner: CliRunner, app_ref: str, sqlite_url: str, task: str, args: str, needle: str
) -> None:
    assert tether(runner, "migrate", "--app", app_ref).exit_code == 0
    res = tether(runner, "enqueue", task, "--app", app_ref, "--args", args)
    assert_one_line_error(res, 2, needle)
    assert total_jobs(sqlite_url) == 0


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite://", "sqlite:///"])
def test_malformed_database_url_is_a_one_line_error(
    runner: CliRunner, app_ref: str, tmp_path: Path, url: str
) -> None:
    before = set(tmp_path.iterdir())
    assert_one_line_error(tether(runner, "stats", "--database", url), 2, url)
    res = tether(runner, "enqueue", "hello", "--app", app_ref, "--database", url)
    assert_one_line_error(res, 2, url)
    assert set(tmp_path.iterdir()) == before  # no database file appeared


def test_unreachable_database_names_it(runner: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/no/such/dir/x.db"
    assert_one_line_error(tether(runner, "job", "list", "-d", url), 1, "sqlite", url)


def test_app_errors_are_one_line(runner: CliRunner, app_ref: str) -> None:
    module = app_ref.split(":")[0]
    assert_one_line_error(tether(runner, "enqueue", "hello"), 2, "--app")
    assert_one_line_error(
        tether(runner, "enqueue", "hello", "--app", "no_such_mod:app"), 2, "no_such_mod"
    )
    assert_one_line_error(
        tether(runner, "enqueue", "hello", "--app", f"{module}:nothing"), 2, "no attribute"
    )
    assert_one_line_error(
        tether(runner, "enqueue", "hello", "--app", f"{module}:time"), 2, "not a tether.App"
    )


def test_database_option_overrides_the_apps_url(
    runner: CliRunner, app_ref: str, tmp_path: Path, sqlite_url: str
) -> None:
    other = f"sqlite:///{tmp_path}/other.db"
    assert tether(runner, "migrate", "--database", other).exit_code == 0
    res = tether(runner, "enqueue", "hello", "--app", app_ref, "--database", other)
    assert res.exit_code == 0, res.output
    assert total_jobs(other) == 1
    assert not (tmp_path / "tether.db").exists()  # the app's own database was not touched


def test_app_and_database_come_from_the_environment(
    runner: CliRunner, app_ref: str, tmp_path: Path, sqlite_url: str
) -> None:
    res = runner.invoke(cli, ["enqueue", "hello"], env={"TETHER_APP": app_ref})
    assert res.exit_code == 0, res.output
    assert total_jobs(sqlite_url) == 1
    # Without an app, $TETHER_DATABASE_URL names the database.
    listed = runner.invoke(cli, ["job", "list", "--json"], env={"TETHER_DATABASE_URL": sqlite_url})
    assert [j["task"] for j in json.loads(listed.stdout)] == ["hello"]


@pytest.mark.parametrize(
    "command",
    [[], ["worker"], ["migrate"], ["enqueue"], ["job"], ["job", "list"], ["job", "show"],
     ["job", "cancel"], ["job", "cancel-status"], ["job", "cancellations"], ["job", "pause"],
     ["job", "resume"], ["job", "retry"], ["job", "wait"], ["queue"], ["queue", "list"],
     ["queue", "pause"], ["queue", "resume"], ["stats"], ["workers"], ["demo"],
     ["rate-limit"], ["rate-limit", "set"], ["rate-limit", "remove"], ["rate-limit", "list"]],
)  # fmt: skip
def test_every_command_has_help(runner: CliRunner, command: list[str]) -> None:
    res = tether(runner, *command, "--help")
    assert res.exit_code == 0, res.output
    assert "Usage:" in res.stdout
    # The summary line under "Usage:" is the command's docstring, not empty.
    summary = res.stdout.split("Usage:", 1)[1].strip().splitlines()[2].strip()
    assert len(summary) > 10, res.stdout


# -- job list / show / cancel ------------------------------------------------------------


def _enqueue(url: str, n: int, task: str = "hello") -> list[Job]:
    async def go(app: App) -> list[Job]:
        app.task(name=task)(_noop)
        return [await app.enqueue(task, {"n": i}) for i in range(n)]

    return with_app(url, go)


async def _noop(ctx: Any, **kwargs: Any) -> None:
    return None


def test_job_list_filters_and_shows_cancelling(runner: CliRunner, sqlite_url: str) -> None:
    jobs = _enqueue(sqlite_url, 3)
    running = claim_one(sqlite_url)
    assert running.id == jobs[0].id
    with_app(sqlite_url, lambda a: a.cancel(running.id, wait=0))

    res = tether(runner, "job", "list", "-d", sqlite_url, "--json")
    assert res.exit_code == 0, res.output
    listed = json.loads(res.stdout)
    assert [j["id"] for j in listed] == [3, 2, 1]  # newest first
    assert listed[2]["state"] == "running"
    assert listed[2]["display_state"] == "cancelling"

    table = tether(runner, "job", "list", "-d", sqlite_url)
    assert table.exit_code == 0
    assert "cancelling" in table.stdout and "queued" in table.stdout

    only = tether(runner, "job", "list", "-d", sqlite_url, "-s", "running", "--json")
    assert [j["id"] for j in json.loads(only.stdout)] == [1]
    limited = tether(runner, "job", "list", "-d", sqlite_url, "--limit", "1", "--json")
    assert [j["id"] for j in json.loads(limited.stdout)] == [3]
    bad = tether(runner, "job", "list", "-d", sqlite_url, "-s", "bogus")
    assert_one_line_error(bad, 2, "unknown state")


def test_job_list_on_an_empty_database(runner: CliRunner, sqlite_url: str) -> None:
    assert tether(runner, "migrate", "-d", sqlite_url).exit_code == 0
    res = tether(runner, "job", "list", "-d", sqlite_url)
    assert res.exit_code == 0
    assert res.stdout.strip() == "no jobs"


@pytest.mark.parametrize(
    "command",
    [["job", "list"], ["job", "show", "1"], ["stats"], ["workers"], ["queue", "list"],
     ["queue", "pause", "default", "--create"], ["job", "cancel", "1"], ["job", "wait", "1"]],
)  # fmt: skip
def test_a_sqlite_database_that_does_not_exist_is_an_error(
    runner: CliRunner, tmp_path: Path, command: list[str]
) -> None:
    url = f"sqlite:///{tmp_path}/typo.db"
    res = tether(runner, *command, "-d", url)
    assert_one_line_error(res, 1, "no SQLite database at", "typo.db")
    assert not (tmp_path / "typo.db").exists()
    # migrate creates it; then the same command reads it.
    assert tether(runner, "migrate", "-d", url).exit_code == 0
    assert tether(runner, "stats", "-d", url).exit_code == 0


def test_job_show_prints_fields_and_history(runner: CliRunner, sqlite_url: str) -> None:
    (job,) = _enqueue(sqlite_url, 1)
    claimed = claim_one(sqlite_url)
    succeed(sqlite_url, claimed)

    res = tether(runner, "job", "show", str(job.id), "-d", sqlite_url)
    assert res.exit_code == 0, res.output
    for needle in ("args", '{"n": 0}', "succeeded", "history", "queued → running", "enqueue"):
        assert needle in res.stdout

    data = json.loads(tether(runner, "job", "show", str(job.id), "-d", sqlite_url, "--json").stdout)
    assert data["job"]["state"] == "succeeded"
    assert data["job"]["result"] == 1
    transitions = [(e["from_state"], e["to_state"]) for e in data["events"]]
    assert transitions == [(None, "queued"), ("queued", "running"), ("running", "succeeded")]

    assert_one_line_error(tether(runner, "job", "show", "999", "-d", sqlite_url), 1, "999")


def test_job_show_lists_steps_and_what_a_parked_job_waits_for_and_signal_wakes_it(
    runner: CliRunner, sqlite_url: str
) -> None:
    (job,) = _enqueue(sqlite_url, 1)
    claimed = claim_one(sqlite_url)

    async def park(store: Store) -> str:
        assert await store.save_step(job.id, claimed.lease_token, "plan", '{"pages": 3}')
        worker = claimed.worker_id or ""
        found = await store.wait(
            worker,
            job.id,
            claimed.lease_token,
            "signal:approval",
            signal="approval",
            seconds=3600,
            reason="waiting for signal 'approval'",
        )
        return found.outcome

    assert with_store(sqlite_url, park) == "parked"
    shown = tether(runner, "job", "show", str(job.id), "-d", sqlite_url)
    assert shown.exit_code == 0, shown.output
    for needle in ("steps", "plan", '{"pages":3}', "signal:approval", "times out"):
        assert needle in shown.stdout
    assert "waiting for signal 'approval', until" in shown.stdout
    data = json.loads(tether(runner, "job", "show", str(job.id), "-d", sqlite_url, "--json").stdout)
    assert [(s["name"], s["state"]) for s in data["steps"]] == [
        ("plan", "done"),
        ("signal:approval", "waiting"),
    ]
    assert data["waiting_for"].startswith("waiting for signal 'approval'")

    bad = tether(
        runner, "job", "signal", str(job.id), "approval", "--payload", "{no", "-d", sqlite_url
    )
    assert_one_line_error(bad, 2, "--payload is not valid JSON")
    sent = tether(
        runner, "job", "signal", str(job.id), "approval", "--payload", '{"ok": 1}', "-d", sqlite_url
    )
    assert sent.exit_code == 0 and "runs again now" in sent.stdout, sent.output
    again = tether(
        runner, "job", "signal", str(job.id), "approval", "--payload", '{"ok": 1}', "-d", sqlite_url
    )
    assert again.exit_code == 0 and "nothing changed" in again.stdout, again.output
    other = tether(
        runner, "job", "signal", str(job.id), "approval", "--payload", '{"ok": 2}', "-d", sqlite_url
    )
    assert_one_line_error(other, 1, "another payload")
    assert_one_line_error(
        tether(runner, "job", "signal", "999", "approval", "-d", sqlite_url), 1, "999"
    )


def test_job_wait_exits_0_only_for_success(runner: CliRunner, sqlite_url: str) -> None:
    good, bad = _enqueue(sqlite_url, 2)
    succeed(sqlite_url, claim_one(sqlite_url))
    with_app(sqlite_url, lambda a: a.cancel(bad.id))
    ok = tether(runner, "job", "wait", str(good.id), "-d", sqlite_url)
    assert (ok.exit_code, ok.stdout.strip()) == (0, f"job {good.id} succeeded")
    no = tether(runner, "job", "wait", str(bad.id), "-d", sqlite_url)
    assert (no.exit_code, no.stdout.strip()) == (1, f"job {bad.id} cancelled")


def test_job_cancel_outcomes(runner: CliRunner, sqlite_url: str) -> None:
    done_id, running_id, queued_id = (j.id for j in _enqueue(sqlite_url, 3))
    # Claims take the oldest job first.
    done = claim_one(sqlite_url)
    assert done.id == done_id
    succeed(sqlite_url, done)
    assert claim_one(sqlite_url).id == running_id

    res = tether(runner, "job", "cancel", str(queued_id), "-d", sqlite_url, "--reason", "typo")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == f"Cancelling job {queued_id} (hello)"
    assert "✓ Stopped task assignment (queued → cancelled)" in lines
    assert "- No runner was active" in lines
    assert f"job {queued_id} cancelled" in lines
    assert lines[-1] == "Status: COMPLETED"
    assert lines[-2].startswith("Cancellation ID: cancel-")
    job = with_app(sqlite_url, lambda a: a.get(queued_id))
    assert job.state is JobState.CANCELLED
    assert job.cancel_reason == "typo"

    again = tether(runner, "job", "cancel", str(queued_id), "-d", sqlite_url)
    assert again.exit_code == 0
    cid = lines[-2].removeprefix("Cancellation ID: ")
    # It names the first cancellation and when it was, instead of replaying its steps.
    assert again.stdout.startswith(f"job {queued_id} was already cancelled (cancellation {cid} at ")
    assert "Stopped task assignment" not in again.stdout
    assert "Cancelling job" not in again.stdout

    # A running job whose worker never answers: the request is recorded, exit 0.
    req = tether(runner, "job", "cancel", str(running_id), "-d", sqlite_url, "--wait", "0",
                 "--json")  # fmt: skip
    assert req.exit_code == 0, req.output
    assert json.loads(req.stdout)["outcome"] == "requested"
    assert json.loads(req.stdout)["job"]["display_state"] == "cancelling"

    finished = tether(runner, "job", "cancel", str(done_id), "-d", sqlite_url)
    assert_one_line_error(finished, 1, f"cannot cancel job {done_id}", "succeeded")
    assert with_app(sqlite_url, lambda a: a.get(done_id)).state is JobState.SUCCEEDED

    assert_one_line_error(
        tether(runner, "job", "cancel", "12345", "-d", sqlite_url), 1, "job 12345 does not exist"
    )


def test_cancel_of_a_job_that_finished_first_lists_no_terminated_runner(
    runner: CliRunner, sqlite_url: str
) -> None:
    (job,) = _enqueue(sqlite_url, 1)
    claimed = claim_one(sqlite_url)

    def finish_once_asked() -> None:
        # The handler returns just as the request arrives, before its worker saw it.
        deadline = time.monotonic() + 20
        while with_app(sqlite_url, lambda a: a.get(job.id)).cancel_requested_at is None:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        succeed(sqlite_url, claimed)

    helper = threading.Thread(target=finish_once_asked)
    helper.start()
    res = tether(runner, "job", "cancel", str(job.id), "-d", sqlite_url, "--wait", "20")
    helper.join()
    assert res.exit_code == 0, res.output
    assert "succeeded before it saw the cancel request" in res.stdout
    assert "Terminated" not in res.stdout
    assert "- Runners terminated: 0" in res.stdout
    assert "No runner to stop: the job ended before the request reached it" in res.stdout


def test_job_cancel_and_wait_show_live_progress_on_a_terminal(
    runner: CliRunner, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (job,) = _enqueue(sqlite_url, 1)
    claim_one(sqlite_url)  # its fake worker never answers
    screen = io.StringIO()
    monkeypatch.setattr(cli_output, "err", Console(file=screen, force_terminal=True, width=200))
    res = tether(runner, "job", "cancel", str(job.id), "-d", sqlite_url, "--wait", "0.3")
    assert res.exit_code == 0, res.output
    assert f"Cancelling job {job.id}: running (0s)" in screen.getvalue()
    res = tether(runner, "job", "wait", str(job.id), "-d", sqlite_url, "--timeout", "0.3")
    assert f"Waiting for job {job.id}: cancelling (0s)" in screen.getvalue()
    # Piped (not a terminal), nothing but the result is printed.
    monkeypatch.setattr(cli_output, "err", Console(file=io.StringIO(), force_terminal=False))
    res = tether(runner, "job", "wait", str(job.id), "-d", sqlite_url, "--timeout", "0.1")
    assert "Waiting for" not in res.output


def test_cancel_status_and_cancellations_show_the_record(
    runner: CliRunner, sqlite_url: str
) -> None:
    queued, other = _enqueue(sqlite_url, 2)
    assert tether(runner, "job", "cancel", str(queued.id), "-d", sqlite_url).exit_code == 0

    res = tether(runner, "job", "cancel-status", str(queued.id), "-d", sqlite_url)
    assert res.exit_code == 0, res.output
    assert "completed" in res.stdout and "steps" in res.stdout and "request" in res.stdout
    record = json.loads(
        tether(runner, "job", "cancel-status", str(queued.id), "-d", sqlite_url, "--json").stdout
    )
    assert (record["job_id"], record["status"]) == (queued.id, "completed")
    assert record["initiated_by"].startswith("cli")  # cli:<OS user>
    assert record["steps"][0]["name"] == "request"
    show = tether(runner, "job", "show", str(queued.id), "-d", sqlite_url)
    assert f"cancellation {record['id']}: completed" in show.stdout

    listed = json.loads(tether(runner, "job", "cancellations", "-d", sqlite_url, "--json").stdout)
    assert [r["id"] for r in listed] == [record["id"]]
    none = tether(runner, "job", "cancel-status", str(other.id), "-d", sqlite_url)
    assert_one_line_error(none, 1, "no cancellation")


def test_pause_resume_and_retry(runner: CliRunner, sqlite_url: str) -> None:
    first, second = _enqueue(sqlite_url, 2)
    paused = tether(runner, "job", "pause", str(second.id), "-d", sqlite_url, "--reason", "hold")
    assert paused.exit_code == 0, paused.output
    assert paused.stdout.startswith(f"job {second.id} paused")
    assert with_app(sqlite_url, lambda a: a.get(second.id)).state is JobState.PAUSED
    resumed = tether(runner, "job", "resume", str(second.id), "-d", sqlite_url)
    assert resumed.stdout.strip() == f"job {second.id} is queued again"
    again = tether(runner, "job", "resume", str(second.id), "-d", sqlite_url)
    assert_one_line_error(again, 1, "cannot resume", "queued")

    claimed = claim_one(sqlite_url)
    assert claimed.id == first.id
    finish(
        sqlite_url, claimed, Outcome(claimed.id, claimed.lease_token, JobState.FAILED, error="x")
    )
    retried = tether(runner, "job", "retry", str(first.id), "-d", sqlite_url, "--json")
    assert retried.exit_code == 0, retried.output
    assert json.loads(retried.stdout)["state"] == "queued"
    not_failed = tether(runner, "job", "retry", str(second.id), "-d", sqlite_url)
    assert_one_line_error(not_failed, 1, "cannot retry")


def test_queue_pause_resume_and_list(runner: CliRunner, sqlite_url: str) -> None:
    _enqueue(sqlite_url, 2)
    res = tether(runner, "queue", "pause", "default", "-d", sqlite_url, "--reason", "deploy")
    assert res.exit_code == 0, res.output
    (queue,) = json.loads(tether(runner, "queue", "list", "-d", sqlite_url, "--json").stdout)
    assert (queue["name"], queue["paused"], queue["reason"]) == ("default", True, "deploy")
    assert queue["counts"]["queued"] == 2
    assert "deploy" in tether(runner, "queue", "list", "-d", sqlite_url).stdout
    assert tether(runner, "queue", "resume", "default", "-d", sqlite_url).exit_code == 0
    (queue,) = json.loads(tether(runner, "queue", "list", "-d", sqlite_url, "--json").stdout)
    assert queue["paused"] is False


def test_queue_pause_and_resume_say_what_they_did(runner: CliRunner, sqlite_url: str) -> None:
    _enqueue(sqlite_url, 1)
    paused = tether(runner, "queue", "pause", "default", "-d", sqlite_url)
    assert paused.stdout == "queue default paused: no new claims; running jobs finish\n"
    resumed = tether(runner, "queue", "resume", "default", "-d", sqlite_url)
    assert resumed.stdout == "queue default resumed\n"
    made = tether(runner, "queue", "resume", "later", "--create", "-d", sqlite_url)
    assert made.stdout == "queue later resumed\n"


def test_queue_pause_of_a_never_seen_queue_needs_create(runner: CliRunner, sqlite_url: str) -> None:
    _enqueue(sqlite_url, 1)
    typo = tether(runner, "queue", "pause", "defualt", "-d", sqlite_url)
    assert_one_line_error(typo, 2, "queue 'defualt' has never been seen", "default", "--create")
    assert_one_line_error(
        tether(runner, "queue", "resume", "defualt", "-d", sqlite_url), 2, "--create"
    )
    (queue,) = json.loads(tether(runner, "queue", "list", "-d", sqlite_url, "--json").stdout)
    assert queue["name"] == "default"  # no phantom queue
    made = tether(runner, "queue", "pause", "later", "--create", "-d", sqlite_url)
    assert made.exit_code == 0, made.output
    names = [
        q["name"]
        for q in json.loads(tether(runner, "queue", "list", "-d", sqlite_url, "--json").stdout)
    ]
    assert names == ["default", "later"]
    # A queue only a worker listens on is known too.
    with_store(
        sqlite_url,
        lambda s: s.register_worker("h:1:a", None, "h", 1, None, ["mail"], 1, tasks=["mail.send"]),
    )
    assert tether(runner, "queue", "pause", "mail", "-d", sqlite_url).exit_code == 0


# -- stats and workers -------------------------------------------------------------------


def test_stats_counts_every_state(runner: CliRunner, sqlite_url: str) -> None:
    jobs = _enqueue(sqlite_url, 3)
    with_app(sqlite_url, lambda a: a.cancel(jobs[0].id))
    res = tether(runner, "stats", "-d", sqlite_url, "--json")
    assert res.exit_code == 0, res.output
    counts = json.loads(res.stdout)
    assert set(counts) == {s.value for s in JobState}
    assert (counts["queued"], counts["cancelled"], sum(counts.values())) == (2, 1, 3)
    table = tether(runner, "stats", "-d", sqlite_url).stdout
    assert "total" in table and "cancelled" in table


def test_workers_lists_active_ones_unless_all(runner: CliRunner, sqlite_url: str) -> None:
    async def go(store: Store) -> None:
        await store.register_worker("h:1:a", "alpha", "h", 1, None, ["default"], 4)
        await store.register_worker("h:2:b", "beta", "h", 2, None, ["default"], 4)
        await store.set_worker_state("h:2:b", "stopped")

    with_store(sqlite_url, go)
    res = tether(runner, "workers", "-d", sqlite_url, "--json")
    assert res.exit_code == 0, res.output
    assert [(w["id"], w["state"]) for w in json.loads(res.stdout)] == [("h:1:a", "active")]
    everyone = json.loads(tether(runner, "workers", "-d", sqlite_url, "--all", "--json").stdout)
    assert {w["id"] for w in everyone} == {"h:1:a", "h:2:b"}
    table = tether(runner, "workers", "-d", sqlite_url)
    assert "alpha" in table.stdout and "1 stopped or dead not shown" in table.stdout


def test_a_job_no_worker_serves_is_flagged_by_show_queue_list_and_workers(
    runner: CliRunner, sqlite_url: str
) -> None:
    (job,) = _enqueue(sqlite_url, 1)

    async def go(store: Store) -> None:
        await store.register_worker(
            "h:1:a", "alpha", "h", 1, None, ["mail"], 4, tasks=["mail.send"]
        )

    with_store(sqlite_url, go)
    why = "no worker serves task hello on queue default (no worker listens on this queue)"
    show = tether(runner, "job", "show", str(job.id), "-d", sqlite_url)
    assert show.exit_code == 0, show.output
    assert f"⚠ waiting forever: {why}" in " ".join(show.stdout.split())
    data = json.loads(tether(runner, "job", "show", str(job.id), "-d", sqlite_url, "--json").stdout)
    assert data["unserved"] == why
    queues = tether(runner, "queue", "list", "-d", sqlite_url)
    assert f"⚠ queue default: 1 waiting job(s): {why}" in " ".join(queues.stdout.split())
    (queue,) = json.loads(tether(runner, "queue", "list", "-d", sqlite_url, "--json").stdout)
    assert [u["task"] for u in queue["unserved"]] == ["hello"]
    (worker,) = json.loads(tether(runner, "workers", "-d", sqlite_url, "--json").stdout)
    assert (worker["queues"], worker["tasks"]) == (["mail"], ["mail.send"])
    table = tether(runner, "workers", "-d", sqlite_url).stdout
    assert "queues" in table and "mail.send" in table


def test_worker_timing_options_reach_its_config(runner: CliRunner, app_ref: str) -> None:
    # The worker's config checks them: a lease that one slow heartbeat could cost is refused.
    res = tether(runner, "worker", "--app", app_ref, "--lease", "5", "--heartbeat", "2")
    assert_one_line_error(res, 2, "lease_duration must be at least 2 * heartbeat_interval")
    res = tether(runner, "worker", "--app", app_ref, "--log-format", "xml")
    assert_one_line_error(res, 2, "--log-format", "text or json")
    help_text = tether(runner, "worker", "--help").stdout
    for flag in ("--lease", "--heartbeat", "--stop-timeout", "--cancel-grace", "--ramp-window",
                 "--log-format"):  # fmt: skip
        assert flag in help_text


def test_rate_limit_set_list_and_remove(runner: CliRunner, sqlite_url: str) -> None:
    _enqueue(sqlite_url, 3)
    res = tether(runner, "rate-limit", "set", "--queue", "default", "--per-second", "0.5",
                 "--burst", "2", "-d", sqlite_url)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "queue default: at most 0.5 job(s)/s, bursts of 2"
    assert tether(runner, "rate-limit", "set", "--task", "hello", "--per-second", "3",
                  "-d", sqlite_url).exit_code == 0  # fmt: skip
    listed = json.loads(tether(runner, "rate-limit", "list", "-d", sqlite_url, "--json").stdout)
    assert [(r["scope"], r["name"], r["per_second"], r["burst"]) for r in listed] == [
        ("queue", "default", 0.5, 2),
        ("task", "hello", 3.0, 3),  # the burst defaults to the rate, rounded up
    ]
    # Claims spend the bucket: two of the three queued jobs start, the third waits.
    claim_one(sqlite_url)
    claim_one(sqlite_url)
    with pytest.raises(ValueError):
        claim_one(sqlite_url)
    assert "default" in tether(runner, "rate-limit", "list", "-d", sqlite_url).stdout
    both = tether(runner, "rate-limit", "set", "--queue", "a", "--task", "b", "--per-second",
                  "1", "-d", sqlite_url)  # fmt: skip
    assert_one_line_error(both, 2, "a queue or to a task")
    bad = tether(runner, "rate-limit", "set", "--queue", "a", "--per-second", "0", "-d", sqlite_url)
    assert_one_line_error(bad, 2, "per_second must be positive")
    assert (
        tether(runner, "rate-limit", "remove", "--queue", "default", "-d", sqlite_url).exit_code
        == 0
    )
    gone = tether(runner, "rate-limit", "remove", "--queue", "default", "-d", sqlite_url)
    assert_one_line_error(gone, 1, "queue default has no rate limit")


# -- PostgreSQL ----------------------------------------------------------------------------


@pytest.mark.postgres
def test_enqueue_list_cancel_on_postgres(runner: CliRunner, app_ref: str, pg_url: str) -> None:
    assert re.fullmatch(
        r"applied migrations: 1(, \d+)*", tether(runner, "migrate", "-d", pg_url).stdout.strip()
    )
    res = tether(runner, "enqueue", "hello", "--app", app_ref, "-d", pg_url, "--json")
    assert res.exit_code == 0, res.output
    job_id = json.loads(res.stdout)["id"]
    bad = tether(runner, "enqueue", "hello", "--app", app_ref, "-d", pg_url, "--args", "{")
    assert_one_line_error(bad, 2, "not valid JSON")
    listed = json.loads(tether(runner, "job", "list", "-d", pg_url, "--json").stdout)
    assert [j["id"] for j in listed] == [job_id]
    cancel = tether(runner, "job", "cancel", str(job_id), "-d", pg_url)
    assert f"job {job_id} cancelled" in cancel.stdout.splitlines()
    counts = json.loads(tether(runner, "stats", "-d", pg_url, "--json").stdout)
    assert (counts["cancelled"], sum(counts.values())) == (1, 1)


# -- the worker and the demo as processes ----------------------------------------------------


def _spawn(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [TETHER, *args],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _env() -> dict[str, str]:
    """The environment without TETHER_ settings, and without the virtualenv's bin folder
    on PATH (as after ``make demo``, where a bare ``tether`` is "command not found")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    bin_dir = os.path.dirname(TETHER)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir)
    return env


def wait_job(
    proc: subprocess.Popen[str], url: str, job_id: int, done: Callable[[Job], bool]
) -> Job:
    """Poll the job until ``done``; fail at once if the worker process died."""
    deadline = time.monotonic() + 20
    while True:
        job = with_app(url, lambda a: a.get(job_id))
        if done(job):
            return job
        if proc.poll() is not None:
            pytest.fail(f"worker exited with {proc.returncode}: {proc.communicate()[1]}")
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} still {job.display_state} after 20s")
        time.sleep(0.05)


def test_worker_runs_jobs_and_exits_0_on_sigterm(
    runner: CliRunner, app_ref: str, tmp_path: Path, sqlite_url: str
) -> None:
    res = tether(runner, "enqueue", "hello", "--app", app_ref, "--args", '{"name": "w"}',
                 "--json")  # fmt: skip
    job_id = json.loads(res.stdout)["id"]
    proc = _spawn(["worker", "--app", app_ref, "--concurrency", "2"], tmp_path)
    try:
        job = wait_job(proc, sqlite_url, job_id, lambda j: j.is_terminal)
        assert job.state is JobState.SUCCEEDED
        assert job.result == {"greeting": "hello w"}
        workers = json.loads(tether(runner, "workers", "--app", app_ref, "--json").stdout)
        assert [w["pid"] for w in workers] == [proc.pid]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "stopped" in stderr
    # Log lines carry timestamps: "2025-01-01 12:00:00,000 INFO ..."
    assert stderr.splitlines()[0][:4].isdigit() and stderr.splitlines()[0][4] == "-"
    everyone = json.loads(tether(runner, "workers", "--app", app_ref, "--all", "--json").stdout)
    assert [w["state"] for w in everyone] == ["stopped"]


def test_worker_log_format_json_writes_one_object_per_line_with_job_fields(
    runner: CliRunner, app_ref: str, tmp_path: Path, sqlite_url: str
) -> None:
    res = tether(runner, "enqueue", "hello", "--app", app_ref, "--json")
    job_id = json.loads(res.stdout)["id"]
    args = ["worker", "--app", app_ref, "--log-format", "json", "--log-level", "debug"]
    proc = _spawn(args, tmp_path)
    try:
        wait_job(proc, sqlite_url, job_id, lambda j: j.is_terminal)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    entries = [json.loads(line) for line in stderr.splitlines()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= e.keys() for e in entries)
    by_event = {e.get("event"): e for e in entries if e.get("job_id") == job_id}
    started, finished = by_event["job_started"], by_event["job_finished"]
    assert (started["task"], started["attempt"], started["queue"]) == ("hello", 1, "default")
    assert (finished["state"], finished["attempt"], finished["level"]) == ("succeeded", 1, "debug")
    assert isinstance(finished["duration"], float) and finished["duration"] >= 0


SCRIPT_SOURCE = """
import asyncio

import tether

app = tether.App({url!r})


@app.task
async def crawl(ctx, url):
    return url


if __name__ == "__main__":
    job = crawl.enqueue_sync(url="https://example.org")
    print(job.id, job.task)
"""


def test_a_job_enqueued_by_running_the_module_as_a_script_runs_on_its_worker(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's example: `python mymodule.py` enqueues, `tether worker --app
    # mymodule:app` runs it. The two must agree on the task's name.
    (tmp_path / "mymodule.py").write_text(SCRIPT_SOURCE.format(url=sqlite_url))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    done = subprocess.run([sys.executable, "mymodule.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    job_id, task = done.stdout.split()
    assert task == "mymodule.crawl"
    proc = _spawn(["worker", "--app", "mymodule:app"], tmp_path)
    try:
        job = wait_job(proc, sqlite_url, int(job_id), lambda j: j.is_terminal)
    finally:
        proc.kill()
        proc.communicate(timeout=15)
    assert (job.state, job.result) == (JobState.SUCCEEDED, "https://example.org")


def test_worker_exits_even_when_a_thread_handler_ignores_the_stop(
    runner: CliRunner, app_ref: str, tmp_path: Path, sqlite_url: str
) -> None:
    res = tether(runner, "enqueue", "stubborn", "--app", app_ref, "--json")
    job_id = json.loads(res.stdout)["id"]
    proc = _spawn(["worker", "--app", app_ref, "--stop-timeout", "0.2"], tmp_path)
    try:
        wait_job(proc, sqlite_url, job_id, lambda j: j.state is JobState.RUNNING)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
        took = time.monotonic() - started
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    # The handler sleeps 60s; the worker left after its grace, not after the thread.
    assert took < 15
    job = with_app(sqlite_url, lambda a: a.get(job_id))
    # Released for another worker; a release does not spend the attempt.
    assert job.state is JobState.QUEUED
    assert job.attempt == 0


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    proc = _spawn(["demo", "--duration", "8"], tmp_path)
    try:
        stdout, stderr = proc.communicate(timeout=45)
    finally:
        proc.kill()
    assert proc.returncode == 0, stdout + stderr
    assert "tether demo ran" in stdout
    assert "Traceback" not in stdout + stderr
    db = tmp_path / ".tether" / "demo.db"
    assert db.exists()
    url = f"sqlite:///{db}"
    counts = with_app(url, lambda a: a.jobs.stats())
    assert counts["succeeded"] >= 5, counts
    assert counts["running"] == 0, counts  # every running job was settled or released
    jobs = with_app(url, lambda a: a.jobs.list(limit=500))
    assert {"crawl", "chunk", "embed", "upsert"} <= {
        j.task for j in jobs if j.state is JobState.SUCCEEDED
    }
    # What it tells you to run in another terminal works there as printed.
    explore = stdout.split("explore:", 1)[1].splitlines()
    listing = next(line.strip() for line in explore if " job list" in line)
    shown = subprocess.run(
        listing, shell=True, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, (listing, shown.stderr)
    assert "crawl" in shown.stdout
    # The demo cancels its long crawl while it runs; retries recover the flaky ones.
    (long_crawl,) = [j for j in jobs if j.args.get("url") == "https://example.org/archive"]
    assert long_crawl.state is JobState.CANCELLED
    assert any(j.state is JobState.SUCCEEDED and j.attempt > 1 for j in jobs)


def test_a_task_rate_limit_takes_the_short_name_and_refuses_an_unknown_task(
    runner: CliRunner, app_ref: str, sqlite_url: str
) -> None:
    assert tether(runner, "migrate", "-d", sqlite_url).exit_code == 0
    res = tether(runner, "rate-limit", "set", "--task", "send", "--per-second", "1",
                 "--app", app_ref)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().startswith("task mail.send:")
    typo = tether(runner, "rate-limit", "set", "--task", "snd", "--per-second", "1",
                  "--app", app_ref)  # fmt: skip
    assert_one_line_error(typo, 2, "unknown task 'snd'")
    listed = json.loads(tether(runner, "rate-limit", "list", "--app", app_ref, "--json").stdout)
    assert [r["name"] for r in listed] == ["mail.send"]


def test_a_command_on_a_postgresql_database_without_tether_tables_creates_none(
    runner: CliRunner, pg_url: str
) -> None:
    res = tether(runner, "stats", "-d", pg_url)
    assert_one_line_error(res, 1, "run `tether migrate`")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('tether_jobs')").fetchone() == (None,)
