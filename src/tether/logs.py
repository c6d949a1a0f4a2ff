"""Log records an operator can use: the fields of a job event, and a JSON formatter.

The worker logs job events (claim, start, finish, cancel, pause, signals sent) and the
canceller each cancellation step with ``extra=job_fields(...)``, so the job's id, task,
attempt and duration travel as fields, not only inside the text.
``tether worker --log-format json`` writes each record as one JSON object per line with
those fields, for log collectors; the text format shows them in the message.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# The structured fields a record may carry (``extra=``); the JSON formatter copies them.
FIELDS = (
    "event",
    "job_id",
    "task",
    "queue",
    "attempt",
    "duration",
    "state",
    "reason",
    "worker_id",
    "cancellation_id",
    "step",
    "status",
    "interrupt",
    "signal",
    "pid",
    "leases",
    "lost",
)


def job_fields(event: str, **fields: Any) -> dict[str, Any]:
    """``extra=`` for a job event; ``None`` values are left out."""
    return {"event": event, **{k: v for k, v in fields.items() if v is not None}}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the job
    fields the record carries, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
