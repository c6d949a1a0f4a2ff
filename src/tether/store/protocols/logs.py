"""A job's own log: the lines its handler wrote (:mod:`tether.joblog`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tether.joblog import LogLine, PendingLine


@runtime_checkable
class JobLogStore(Protocol):
    """The lines a job's handler wrote, kept with the job and bounded per job."""

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
        """Add ``lines`` to the job's log, fenced by its lease; ``False``: the lease is
        lost (the job is no longer running under ``lease_token``), nothing written.

        The log keeps the job's first ``max_lines`` lines, as long as their messages
        come to no more than ``max_bytes`` bytes; every line after that is dropped and
        counted in the log's last line (level ``dropped``), with the ``dropped`` lines the
        writer counted instead of sending."""

    async def logs(self, job_id: int, *, after: int = 0, limit: int = 1000) -> list[LogLine]:
        """The job's lines with a ``seq`` above ``after``, in order, at most ``limit``."""
