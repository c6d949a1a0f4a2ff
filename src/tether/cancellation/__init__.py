"""The cancellation service: one persisted record per cancelled job, step by step.

A cancellation moves through ``initiated → stopping_runners → updating_tasks →
cleaning_resources`` and ends ``completed``, ``partial`` or ``failed``. Repeated or
concurrent requests for the same job share one record. Every wait is bounded, and the
record always ends in a settled, truthful status.

- :mod:`~tether.cancellation.records`: the records and their :class:`Status`;
- :mod:`~tether.cancellation.tally`: what a cancellation did, counted from the job rows
  it saw (pure);
- :mod:`~tether.cancellation.wording`: the one place that turns a tally into the
  record's steps, errors and summary;
- :mod:`~tether.cancellation.service`: the canceller, which drives a record through its
  steps (every store call retried, :mod:`~tether.cancellation.calls`);
- :mod:`~tether.cancellation.settle`: settling the records their cancellers no longer
  drive (adopted when the canceller is gone, followed up once the jobs stop).
"""

from tether.cancellation.calls import CancellationBackend
from tether.cancellation.records import (
    CancellationRecord,
    CancellationResult,
    CancellationStep,
    CancellationSummary,
    Status,
    record_from_row,
)
from tether.cancellation.service import CancellationService

__all__ = [
    "CancellationBackend",
    "CancellationRecord",
    "CancellationResult",
    "CancellationService",
    "CancellationStep",
    "CancellationSummary",
    "Status",
    "record_from_row",
]
