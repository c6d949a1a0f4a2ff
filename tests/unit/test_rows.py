"""Row readers: the column list and the Job record stay in step."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from tether.job import Job
from tether.states import JobState
from tether.store.rows import JOB_COLUMNS, RowReader


def test_job_columns_are_in_the_order_of_job_fields() -> None:
    # RowReader.job_from_tuple builds a Job positionally from a row of JOB_COLUMNS.
    columns = [c.strip() for c in JOB_COLUMNS.split(",")]
    assert columns == [f.name for f in dataclasses.fields(Job)]


def test_a_postgresql_tuple_row_converts_state_limits_and_the_scoped_key() -> None:
    # psycopg has converted times, JSON and flags already; the reader does the rest.
    read = RowReader(text_json=False, epoch_times=False).job_from_tuple
    now = datetime.now(UTC)
    values: dict[str, object] = {f.name: None for f in dataclasses.fields(Job)}
    values.update(
        id=7, task="t", args={"a": 1}, queue="q", priority=0, state="running", attempt=1,
        max_attempts=3, run_at=now, created_at=now, lease_token=2, cancel_force=False,
        usage=0, limits=["key:k"], waiting_children=False, cancel_cascade=True,
        idempotency_key="owner\x1fkey",
    )  # fmt: skip
    job = read(tuple(values.values()))
    assert job.state is JobState.RUNNING and job.limits == ("key:k",)
    assert (job.id, job.args, job.lease_token, job.run_at) == (7, {"a": 1}, 2, now)
    assert job.idempotency_key == "key"  # as get() and SQLite hand it out
    assert read(tuple({**values, "limits": None}.values())).limits == ()


def test_a_sqlite_tuple_row_reads_as_the_same_job_as_a_named_row() -> None:
    # SQLite keeps times as Unix seconds, JSON and limits as text, flags as integers.
    values: dict[str, object] = {f.name: None for f in dataclasses.fields(Job)}
    values.update(
        id=7, task="t", args='{"a":[1,2]}', queue="q", priority=3, state="running",
        attempt=1, max_attempts=3, run_at=1700000000.25, created_at=1699999999.5,
        started_at=1700000001.0, lease_expires_at=1700000011.0, heartbeat_at=1700000001.0,
        lease_token=2, cancel_force=1, checkpoint='{"step":4}', usage=0,
        idempotency_key="owner\x1fkey", limits='["key:k"]', waiting_children=0,
        cancel_cascade=1, result="null",
    )  # fmt: skip
    reader = RowReader(text_json=True, epoch_times=True)
    by_name = reader.job(values)
    assert reader.job_from_tuple(tuple(values.values())) == by_name
    assert by_name.cancel_force is True and by_name.limits == ("key:k",)
