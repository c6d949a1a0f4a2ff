"""A cancellation record's typed view keeps exactly what the database holds."""

from __future__ import annotations

from datetime import UTC, datetime

from tether.cancellation import CancellationSummary, Status, record_from_row
from tether.job import CancellationRow

FULL = {
    "tasks_cancelled": [1],
    "tasks_completed": [],
    "tasks_failed": [],
    "runners_terminated": ["job 1 on w-1 (sigterm)"],
    "slots_released": ["key:a"],
    "artifacts_preserved": [],
    "dependents_blocked": [],
    "errors": [],
    "duration_seconds": 0.25,
}


def row(status: str, result: dict[str, object] | None, error: str | None = None) -> CancellationRow:
    return CancellationRow(
        id="cancel-1",
        job_id=1,
        request_id=None,
        reason=None,
        force=False,
        cascade=True,
        initiated_by=None,
        initiated_at=datetime.now(UTC),
        status=status,
        steps=[
            {
                "name": "request",
                "status": "completed",
                "started_at": "t0",
                "completed_at": "t1",
                "details": {"state_before": "running"},
                "error": None,
            }
        ],
        result=result,
        error=error,
        completed_at=None,
    )


def test_a_summary_is_written_back_as_it_was_read_keys_and_order() -> None:
    assert list(CancellationSummary.from_json(FULL).to_json().items()) == list(FULL.items())


def test_a_summary_says_only_what_its_record_holds() -> None:
    failed = {"errors": ["StoreError: down"], "duration_seconds": 0.1}
    assert CancellationSummary.from_json(failed).to_json() == failed


def test_a_record_reads_its_status_steps_and_result_typed() -> None:
    record = record_from_row(row("completed", FULL))
    assert record.status is Status.COMPLETED and record.settled
    assert record.steps[0].to_json() == row("completed", FULL).steps[0]
    assert record.result is not None and record.result.tasks_cancelled == [1]


def test_a_records_errors_are_its_results_else_its_error() -> None:
    assert record_from_row(row("failed", {"errors": ["e1"]}, "e1")).errors == ["e1"]
    assert record_from_row(row("failed", None, "lost")).errors == ["lost"]
    assert record_from_row(row("stopping_runners", None)).errors == []
    assert not record_from_row(row("stopping_runners", None)).settled
