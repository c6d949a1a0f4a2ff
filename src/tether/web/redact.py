"""What a member may learn from a cancellation: only the jobs it may see.

A cascade can reach another principal's jobs (a dependent enqueued by someone else).
Their ids must not reach a member, neither in the result's lists nor in the steps'
details or messages. They are dropped, and ``hidden_jobs`` counts them.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, TypeVar

from pydantic import BaseModel

from tether.errors import JobNotFoundError

# Where a message names a job: "job 12 ..." or an artifact "12/name".
_JOB_REF = re.compile(r"\bjob (\d+)\b|^(\d+)/")
M = TypeVar("M", bound=BaseModel)


def _ids(value: Any, found: set[int]) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _ids(item, found)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, int) and not isinstance(item, bool):
                found.add(item)
            else:
                _ids(item, found)
    elif isinstance(value, str):
        for m in _JOB_REF.finditer(value):
            found.add(int(m.group(1) or m.group(2)))


def _named(text: str) -> set[int]:
    found: set[int] = set()
    _ids(text, found)
    return found


def _strip(value: Any, hidden: set[int]) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v, hidden) for k, v in value.items()}
    if isinstance(value, list):
        kept = []
        for item in value:
            if isinstance(item, int) and not isinstance(item, bool) and item in hidden:
                continue
            if isinstance(item, str) and _named(item) & hidden:
                continue
            kept.append(_strip(item, hidden))
        return kept
    if isinstance(value, str) and _named(value) & hidden:
        return "(about a job you cannot see)"
    return value


async def for_member(caller: Any, model: M, fields: tuple[str, ...]) -> M:
    """``model`` with the jobs ``caller`` may not see removed from ``fields`` (and a
    ``hidden_jobs`` count); unchanged for a caller who sees every job."""
    if caller.principal.owner_filter is None:
        return model
    data = model.model_dump()
    named: set[int] = set()
    for name in fields:
        _ids(data[name], named)
    hidden = set()
    for job_id in sorted(named):
        # The same lookup for every id, whether the job exists or not.
        with contextlib.suppress(JobNotFoundError):
            if caller.principal.sees(await caller.app.get(job_id)):
                continue
        hidden.add(job_id)
    if not hidden:
        return model
    for name in fields:
        data[name] = _strip(data[name], hidden)
    data["hidden_jobs"] = len(hidden)
    return type(model).model_validate(data)
