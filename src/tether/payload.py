"""JSON payloads (args, checkpoints, results) in a form both stores can keep."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

# json.dumps writes a NUL character as \u0000 (after an even number of backslashes,
# or it would be a literal backslash). PostgreSQL's jsonb and text cannot hold it.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def encode(value: Any) -> str:
    """``value`` as compact JSON; raises ``ValueError`` if it is not JSON (NaN and
    infinities included), nests deeper than :data:`MAX_DEPTH`, or holds a NUL character,
    which PostgreSQL cannot store."""
    if value is None:  # most handlers return nothing
        return "null"
    if depth_over(value):
        raise ValueError(TOO_DEEP)
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if "\\u0000" in text and _NUL.search(text):
        raise ValueError("it holds a NUL character (\\x00), which PostgreSQL cannot keep")
    return text


def printable(text: str) -> str:
    """``text`` with NUL characters shown as ``\\x00``, so the database can keep it."""
    return text.replace("\x00", "\\x00")


MAX_DEPTH = 64
"""The deepest nesting of lists and objects a payload may have (args, checkpoints,
results). Deeper JSON could be stored but not read back by every client."""
TOO_DEEP = f"it nests deeper than {MAX_DEPTH} levels of lists and objects"


def depth_over(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` levels deep (a scalar
    is 0 levels, ``{}`` or ``[]`` one). Iterative, so no depth can overflow the stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if level + 1 > limit:
            return True
        stack.extend((child, level + 1) for child in children)
    return False


# A JSON string, whatever brackets it holds.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# A bracket's step in depth, by its byte.
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def text_depth_over(text: str | bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON ``text`` nests lists and objects more than ``limit`` levels deep,
    found by a scan rather than a parse: the answer cannot depend on how much stack a
    parser has left (a tracer such as coverage's, or a deep caller, leaves it less), so
    deep input is refused the same way before any parser sees it."""
    data = text.encode() if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= limit:
        return False  # too few brackets to be deeper, wherever they are
    # The brackets outside strings; the deepest point is the largest running sum.
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit


def readable(value: Any) -> Any:
    """``value``, or a note in its place if it nests deeper than :data:`MAX_DEPTH` (stored
    before the limit existed): one such row must not break a listing."""
    if depth_over(value):
        return {"unreadable": f"nested deeper than {MAX_DEPTH} levels; not shown"}
    return value


KEY_SCOPE = "\x1f"
"""Between an owner and an idempotency key in the stored key (no name holds it)."""


def scoped_key(owner: str | None, key: str | None) -> str | None:
    """The idempotency key as stored: scoped by the job's owner, so one principal's key
    never meets (or reveals) another's. Ownerless jobs keep the key as given."""
    if key is None:
        return None
    if KEY_SCOPE in key:
        raise ValueError("an idempotency key must not hold the \\x1f character")
    return key if owner is None else f"{owner}{KEY_SCOPE}{key}"


def unscoped_key(stored: str | None) -> str | None:
    """The idempotency key as its owner gave it."""
    if stored is None or KEY_SCOPE not in stored:
        return stored
    return stored.split(KEY_SCOPE, 1)[1]
