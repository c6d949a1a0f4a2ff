"""Job states and the one table of legal transitions.

This module owns the state machine. Versioned migrations write the same table into
``tether_transitions`` in SQL (a test checks that the two agree), and a trigger refuses
any UPDATE that is not listed there, so the rule holds even for SQL written by hand.
Only a migration changes the rules in a database: a process never rewrites them from
its own copy, so during a rolling deploy old and new processes enforce the same table.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """The seven states a job can be in."""

    QUEUED = "queued"
    BLOCKED = "blocked"
    RUNNING = "running"
    RETRYING = "retrying"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


Q, B, R, RT, P, S, F, C = (
    JobState.QUEUED,
    JobState.BLOCKED,
    JobState.RUNNING,
    JobState.RETRYING,
    JobState.PAUSED,
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
)

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    Q: frozenset({R, P, C}),
    B: frozenset({Q, C}),
    # running -> queued is a release (shutdown); running -> blocked waits for children.
    R: frozenset({S, F, RT, Q, P, C, B}),
    RT: frozenset({R, P, C}),
    # Cancelling a job paused over its budget fails it instead (it did not finish its work).
    P: frozenset({Q, C, F}),
    S: frozenset(),
    # A person may retry a failed job, or dismiss it (cancel) to unblock its key.
    F: frozenset({Q, C}),
    C: frozenset(),
}

TERMINAL: frozenset[JobState] = frozenset({S, F, C})
"""States a job stays in unless a person acts (only ``failed`` can be retried)."""

CLAIMABLE: frozenset[JobState] = frozenset({Q, RT})
"""States a worker may claim from once ``run_at`` has passed."""

ACTIVE: frozenset[JobState] = frozenset(JobState) - TERMINAL
"""States that still count as work in progress."""


def can_transition(src: JobState, dst: JobState) -> bool:
    """Return whether ``src -> dst`` is a legal transition."""
    return dst in TRANSITIONS[src]


def transition_pairs() -> list[tuple[str, str]]:
    """All legal ``(from, to)`` pairs, plus ``(None -> initial)`` entries, for the store."""
    return sorted((src.value, dst.value) for src, dsts in TRANSITIONS.items() for dst in dsts)
