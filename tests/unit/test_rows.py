"""Row readers: the column list and the Job record stay in step."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from tether.job import Job
from tether.states import JobState
from tether.store.rows import JOB_COLUMNS, job_from_tuple


def test_job_columns_are_in_the_order_of_job_fields() -> None:
    # job_from_tuple builds a Job positionally from a row of JOB_COLUMNS.
    columns = [c.strip() for c in JOB_COLUMNS.split(",")]
    assert columns == [f.name for f in dataclasses.fields(Job)]


def test_job_from_tuple_converts_state_and_limits() -> None:
    now = datetime.now(UTC)
    values: dict[str, object] = {f.name: None for f in dataclasses.fields(Job)}
    values.update(
        id=7, task="t", args={"a": 1}, queue="q", priority=0, state="running", attempt=1,
        max_attempts=3, run_at=now, created_at=now, lease_token=2, cancel_force=False,
        usage=0, limits=["key:k"], waiting_children=False, cancel_cascade=True,
    )  # fmt: skip
    job = job_from_tuple(tuple(values.values()))
    assert job.state is JobState.RUNNING and job.limits == ("key:k",)
    assert (job.id, job.args, job.lease_token, job.run_at) == (7, {"a": 1}, 2, now)
    assert job_from_tuple(tuple({**values, "limits": None}.values())).limits == ()
