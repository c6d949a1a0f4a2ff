"""Pieces of SQLite SQL that several queries share."""

from tether.states import TERMINAL

# Unix seconds, as SQLite keeps every time.
NOW = "((julianday('now') - 2440587.5) * 86400.0)"
TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL))
LIVE_SQL = "'queued', 'blocked', 'running', 'retrying', 'paused'"
# A rate limit's bucket as of now: what it held, refilled since, never above the burst.
RATE_TOKENS = f"min(burst, tokens + max(0.0, {NOW} - refilled_at) * per_second)"


def each(name: str) -> str:
    """The values of the list parameter ``name`` (sent as JSON text), as a subquery."""
    return f"(SELECT value FROM json_each(:{name}))"


def param(name: str) -> str:
    """The placeholder of the named parameter ``name``."""
    return f":{name}"


def in_list(column: str, name: str) -> str:
    """``column`` is one of the values of the list parameter ``name``."""
    return f"{column} IN {each(name)}"


def meta_has(name: str) -> str:
    """The job's meta holds every key and value of the parameter ``name`` (a JSON object
    whose keys are meta keys, so they need no escaping in a path). Qualified: the jobs'
    own ``key`` column would shadow json_each's."""
    return (
        f"NOT EXISTS (SELECT 1 FROM json_each(:{name}) AS w WHERE "
        "json_extract(tether_jobs.meta, '$.\"' || w.key || '\"') IS NOT w.value)"
    )
