"""Pieces of PostgreSQL SQL that several queries share."""

from tether.states import TERMINAL

TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL))
LIVE_SQL = "'queued', 'blocked', 'running', 'retrying', 'paused'"


def param(name: str) -> str:
    """The placeholder of the named parameter ``name``."""
    return f"%({name})s"


def in_list(column: str, name: str) -> str:
    """``column`` is one of the values of the list parameter ``name`` (an array)."""
    return f"{column} = ANY(%({name})s)"


def meta_has(name: str) -> str:
    """The job's meta holds every key and value of the parameter ``name`` (a JSON
    object): containment, which a NULL meta never satisfies."""
    return f"meta @> %({name})s::jsonb"
