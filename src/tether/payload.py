"""JSON payloads (args, checkpoints, results) in a form both stores can keep."""

from __future__ import annotations

import json
import re
from typing import Any

# json.dumps writes a NUL character as \u0000 (after an even number of backslashes,
# or it would be a literal backslash). PostgreSQL's jsonb and text cannot hold it.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def encode(value: Any) -> str:
    """``value`` as compact JSON; raises ``ValueError`` if it is not JSON (NaN and
    infinities included) or holds a NUL character, which PostgreSQL cannot store."""
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
