"""Terminal rendering shared by the ``tether`` command and the demo: colours, bars, ages.

Nothing here touches the database; it turns :class:`~tether.job.Job` snapshots into Rich
renderables and plain JSON.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rich.text import Text

from tether.job import Job, StepInfo

STATE_STYLES: dict[str, str] = {
    "queued": "cyan",
    "blocked": "magenta",
    "running": "bold blue",
    "cancelling": "bold yellow",
    "pausing": "yellow",
    "retrying": "dark_orange",
    "paused": "grey62",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "magenta",
}
"""Style per displayed state (``cancelling`` and ``pausing`` are running jobs with a
pending request)."""

WORKER_STYLES: dict[str, str] = {
    "active": "green",
    "draining": "yellow",
    "stopped": "grey62",
    "dead": "red",
}


def state_text(state: str) -> Text:
    """A displayed state in its colour."""
    return Text(state, style=STATE_STYLES.get(state, ""))


def worker_state_text(state: str) -> Text:
    """A worker state in its colour."""
    return Text(state, style=WORKER_STYLES.get(state, ""))


def bar(current: int | None, total: int | None, width: int = 12, style: str = "blue") -> Text:
    """A progress bar with ``current/total``; empty text when nothing was reported."""
    if current is None:
        return Text("")
    if not total:
        return Text(str(current))
    frac = max(0.0, min(1.0, current / total))
    filled = round(frac * width)
    out = Text()
    out.append("━" * filled, style=style)
    out.append("━" * (width - filled), style="grey30")
    out.append(f" {current}/{total}")
    return out


def job_bar(job: Job, width: int = 12) -> Text:
    """The job's progress bar, full once it succeeded.

    Progress travels with heartbeats, so what a handler reports in its last moments may
    never reach the database; a succeeded job did finish its work, whatever the row says.
    """
    current, total = job.progress_current, job.progress_total
    if job.state.value == "succeeded" and total:
        current = total
    return bar(current, total, width, STATE_STYLES.get(job.display_state, "blue"))


def age(then: datetime | None, now: datetime | None = None) -> str:
    """How long ago ``then`` was, compactly: ``4s``, ``3m12s``, ``2h05m``, ``3d04h``."""
    if then is None:
        return ""
    now = now or datetime.now(UTC)
    return duration((now - then).total_seconds())


def duration(seconds: float) -> str:
    """A non-negative span of seconds, compactly (see :func:`age`)."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def took(start: datetime, end: datetime) -> str:
    """How long something took: milliseconds below 10 s, else as :func:`duration`."""
    seconds = max(0.0, (end - start).total_seconds())
    if seconds < 10:
        return f"{seconds * 1000:,.0f}ms" if seconds < 1 else f"{seconds:.1f}s"
    return duration(seconds)


def when(stamp: datetime, now: datetime) -> str:
    """A time with how far it is from ``now``: ``2026-11-28 17:05:00 UTC (in 4m10s)``."""
    rel = f"in {duration((stamp - now).total_seconds())}" if stamp > now else "now"
    return f"{stamp.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({rel})"


def preview(value: Any, limit: int = 80) -> str:
    """A JSON value on one line, shortened."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def waiting_for(job: Job, steps: Sequence[StepInfo], now: datetime) -> str | None:
    """What a parked job waits for, in words (``None``: it waits for nothing): its
    sleep's end, or a signal, from the step that parked it."""
    if job.state.value not in ("queued", "paused"):
        return None
    for step in steps:
        if step.state != "waiting":
            continue
        if step.kind == "sleep":
            return f"sleeping until {when(step.wakes_at, now)}" if step.wakes_at else "sleeping"
        signal = step.name.removeprefix("signal:")
        limit = f"until {when(step.wakes_at, now)}" if step.wakes_at else "with no time limit"
        return f"waiting for signal {signal!r}, {limit}"
    return None


def first_line(text: str | None, limit: int = 80) -> str:
    """The last non-empty line of an error (a traceback's summary), shortened."""
    if not text:
        return ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1].strip() if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def redact_url(url: str) -> str:
    """The database URL without its password, for logs and screens."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def to_json(value: Any) -> Any:
    """Records (jobs, events, workers) as JSON-ready values: ISO times, plain enums."""
    if isinstance(value, Job):
        data = to_json(dataclasses.asdict(value))
        data["display_state"] = value.display_state
        return data
    if callable(own := getattr(value, "to_json", None)) and not isinstance(value, type):
        return to_json(own())  # a record that keeps its own JSON form (says only what it has)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Field by field rather than asdict(), so nested jobs keep their display_state.
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value
