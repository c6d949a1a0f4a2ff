"""A job's own log: the lines its handler wrote (:mod:`tether.joblog`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tether.joblog import LogBatch, LogLine, LogsWritten, PendingLine


@runtime_checkable
class JobLogStore(Protocol):
    """The lines a job's handler wrote, kept with the job and bounded per job."""

    async def append_log_batches(
        self, batches: Sequence[LogBatch], *, max_lines: int, max_bytes: int
    ) -> LogsWritten:
        """Add each batch's lines to its job's log, in one transaction, each fenced by
        its lease, and say which jobs' lines were taken, and which jobs' rows were held
        locked by someone else (nothing waits for them: try those again later). The
        other jobs are no longer running under the batch's token: nothing of theirs is
        written. One batch per job.

        A log keeps its job's first ``max_lines`` lines, as long as their messages come
        to no more than ``max_bytes`` bytes (UTF-8); every line after that is dropped
        and counted, with the batch's own ``dropped``, in the log's last line (level
        ``dropped``)."""

    async def append_logs(
        self,
        job_id: int,
        lease_token: int,
        lines: Sequence[PendingLine],
        *,
        max_lines: int,
        max_bytes: int,
        dropped: int = 0,
    ) -> bool:
        """:meth:`append_log_batches` for one job; ``False``: the lease is lost.
        :class:`~tether.errors.RowLocked` if the job's row is held locked."""

    async def logs(self, job_id: int, *, after: int = 0, limit: int = 1000) -> list[LogLine]:
        """The job's lines with a ``seq`` above ``after``, in order, at most ``limit``."""
