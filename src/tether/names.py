"""The safe alphabet for the names of queues, concurrency keys, resources, tasks and
schedules.

Names end up in URL paths, HTML, log lines and indexed columns. A name is 1 to 200
characters from ``A-Z a-z 0-9 _ . : - @ < >`` and starts with a letter, a digit or ``_``:
no ``/``, no space or control character, and never ``.`` or ``..``, so a name is always
one URL path segment that no browser rewrites. (``<`` and ``>`` are there for tasks
named after a local function, like ``module.test.<locals>.handler``.)
"""

from __future__ import annotations

import re

from tether.errors import ConfigError, InvalidJobError

MAX_NAME = 200
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:@<>\-]{0,199}$"
_NAME = re.compile(NAME_PATTERN)


MAX_META_KEY = 64
META_KEY_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$"
"""A job meta key: the safe alphabet without ``: @ < >``, 1 to 64 characters (it may
become a query parameter, ``?meta=key:value``, or a label name)."""
_META_KEY = re.compile(META_KEY_PATTERN)


def is_safe_meta_key(key: str) -> bool:
    """Whether ``key`` may name a job meta entry (see :data:`META_KEY_PATTERN`)."""
    return _META_KEY.fullmatch(key) is not None


def is_safe(name: str) -> bool:
    """Whether ``name`` is in the safe alphabet."""
    return _NAME.fullmatch(name) is not None


def check(kind: str, name: str) -> str:
    """``name``, or :class:`~tether.errors.InvalidJobError` saying what a ``kind`` name
    (queue, key, resource, task) may hold."""
    if not isinstance(name, str) or not is_safe(name):
        raise InvalidJobError(
            f"bad {kind} name {name!r}: use 1 to {MAX_NAME} characters from "
            "A-Z a-z 0-9 _ . : - @ < >, starting with a letter, a digit or _"
        )
    return name


def check_config(kind: str, name: str) -> str:
    """:func:`check` for a name given in code (a task, a resource): a
    :class:`~tether.errors.ConfigError`."""
    try:
        return check(kind, name)
    except InvalidJobError as exc:
        raise ConfigError(str(exc)) from None
