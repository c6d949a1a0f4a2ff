"""The one integer parser for text from outside (headers, query strings, forms).

``str.isdigit`` and ``int`` accept more than ASCII digits (``"²".isdigit()`` is true,
``int("٣")`` is 3); text from a client must be plain ASCII digits or it is no number.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]{1,19}")


def parse(text: str | None, lo: int = 0, hi: int = 2**63 - 1) -> int | None:
    """The integer ``text`` spells in ASCII digits (surrounding spaces allowed) if it
    lies in ``[lo, hi]``; otherwise ``None``."""
    if text is None:
        return None
    text = text.strip(" \t")
    if _DIGITS.fullmatch(text) is None:
        return None
    value = int(text)
    return value if lo <= value <= hi else None
