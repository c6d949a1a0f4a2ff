"""A job's metadata: a few string labels set at enqueue and carried with the job.

A tracing hook keeps the enqueue's trace context there (``traceparent``,
``tracestate``) and reads it back when a worker claims the job; operators label jobs
with it. It is not a payload: small, flat, strings only, checked here before anything
is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether import names, payload
from tether.errors import InvalidJobError

MAX_KEYS = 32
"""The most entries one job's meta may have."""
MAX_VALUE = 512
"""The longest value, in characters."""
MAX_BYTES = 4096
"""The largest meta, as compact JSON in UTF-8."""


def check(meta: Mapping[str, Any] | None) -> dict[str, str] | None:
    """``meta`` as a job keeps it (a new dict; ``None`` when empty), or
    :class:`~tether.errors.InvalidJobError` saying what is wrong with it."""
    if meta is None:
        return None
    if not isinstance(meta, Mapping):
        raise InvalidJobError(f"meta must be a mapping of strings, got {type(meta).__name__}")
    if len(meta) > MAX_KEYS:
        raise InvalidJobError(f"meta has {len(meta)} keys; the limit is {MAX_KEYS}")
    out: dict[str, str] = {}
    for key, value in meta.items():
        if not isinstance(key, str) or not names.is_safe_meta_key(key):
            raise InvalidJobError(
                f"bad meta key {key!r}: use 1 to {names.MAX_META_KEY} characters from "
                "A-Z a-z 0-9 _ . -, starting with a letter, a digit or _"
            )
        if not isinstance(value, str):
            raise InvalidJobError(
                f"meta value of {key!r} must be a string, got {type(value).__name__}"
            )
        if len(value) > MAX_VALUE:
            raise InvalidJobError(
                f"meta value of {key!r} has {len(value)} characters; the limit is {MAX_VALUE}"
            )
        out[key] = value
    if not out:
        return None
    try:
        size = len(payload.encode(out).encode())
    except ValueError as exc:
        raise InvalidJobError(f"meta cannot be stored: {exc}") from exc
    if size > MAX_BYTES:
        raise InvalidJobError(f"meta is {size} bytes as JSON; the limit is {MAX_BYTES}")
    return out


def parse_pairs(pairs: list[str] | tuple[str, ...], sep: str = "=") -> dict[str, str]:
    """``key=value`` strings (a command line's, a query's ``key:value``) as a dict;
    :class:`~tether.errors.InvalidJobError` for one without ``sep``. The value may hold
    ``sep`` itself; a repeated key keeps its last value."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, found, value = pair.partition(sep)
        if not found:
            raise InvalidJobError(f"meta {pair!r}: expected key{sep}value")
        out[key] = value
    return out
