"""A job's own log: the lines its handler writes (``ctx.log``, or the ``logging`` module
inside a handler), kept with the job.

A worker buffers the lines and writes them in batches (:mod:`tether.worker.logbook`),
fenced by the job's lease token like every other write of an attempt: a zombie's lines
are refused. Each job keeps its first ``AppConfig.job_log_max_lines`` lines, and no more
than ``AppConfig.job_log_max_bytes`` bytes of messages; what comes after is dropped and
counted, and the count is read back as one last line of level ``dropped``. Lines are
removed with their job (retention, deletion).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

#: The levels a line may carry (``ctx.log(..., level=...)``); ``dropped`` is the store's.
LEVELS = ("debug", "info", "warning", "error", "critical")
#: The level of the line that counts the lines a full log dropped.
DROPPED = "dropped"
#: A single message is cut at this many characters (a line, not a file).
MAX_MESSAGE_CHARS = 8192


def level_name(level: int | str) -> str:
    """The line level of a ``logging`` level or a name (``warn`` is ``warning``)."""
    if isinstance(level, int):
        if level >= logging.CRITICAL:
            return "critical"
        if level >= logging.ERROR:
            return "error"
        if level >= logging.WARNING:
            return "warning"
        if level >= logging.INFO:
            return "info"
        return "debug"
    name = level.lower()
    if name == "warn":
        return "warning"
    if name not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(LEVELS)}")
    return name


@dataclass(frozen=True)
class PendingLine:
    """A line a handler wrote, not yet stored: ``at`` is the worker's clock (Unix
    seconds) when it was written."""

    at: float
    level: str
    message: str

    @property
    def size(self) -> int:
        """What the line counts against the job's byte bound: its message in UTF-8."""
        return len(self.message.encode("utf-8", "replace"))


@dataclass(frozen=True)
class LogBatch:
    """A job's lines to write at once, under the lease ``lease_token``; ``dropped``
    counts lines its writer dropped instead of sending (past the bound already)."""

    job_id: int
    lease_token: int
    lines: list[PendingLine]
    dropped: int = 0


@dataclass(frozen=True)
class LogsWritten:
    """What became of the batches of one write: ``taken``, the jobs whose lines were
    written (or counted); ``busy``, those whose row someone else holds locked (a delete
    in progress, an operator), to try again later. The other jobs' leases are lost:
    their lines are not kept."""

    taken: frozenset[int] = frozenset()
    busy: frozenset[int] = frozenset()


def pending(message: object, level: int | str, at: float) -> PendingLine:
    """A line to store, its message made text and cut at :data:`MAX_MESSAGE_CHARS`."""
    text = message if isinstance(message, str) else str(message)
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + " [cut]"
    return PendingLine(at, level_name(level), text)


@dataclass(frozen=True)
class LogLine:
    """One stored line of a job's log.

    ``seq`` numbers the job's lines from 1 in the order they were written (read more
    with ``after=seq``); ``attempt`` is the attempt that wrote it; ``at`` the time its
    worker's clock gave when the handler wrote it. A line of level ``dropped`` comes
    last, once the log is full: ``dropped`` says how many lines it stands for.
    """

    job_id: int
    seq: int
    attempt: int
    at: datetime
    level: str
    message: str
    dropped: int = 0
