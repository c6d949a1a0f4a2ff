"""Pieces of PostgreSQL SQL that several queries share."""

from tether.states import ACTIVE, TERMINAL

TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL))
ACTIVE_SQL = ", ".join(f"'{s.value}'" for s in sorted(ACTIVE))
LIVE_SQL = "'queued', 'blocked', 'running', 'retrying', 'paused'"
