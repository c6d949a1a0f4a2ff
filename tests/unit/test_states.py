"""The transition table: what may follow what."""

from __future__ import annotations

import pytest

from tether.states import ACTIVE, CLAIMABLE, TERMINAL, TRANSITIONS, JobState, can_transition


def test_every_state_has_an_entry() -> None:
    assert set(TRANSITIONS) == set(JobState)


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.CANCELLED])
def test_succeeded_and_cancelled_are_final(state: JobState) -> None:
    assert TRANSITIONS[state] == frozenset()


def test_a_failed_job_can_only_be_retried_or_dismissed() -> None:
    assert TRANSITIONS[JobState.FAILED] == {JobState.QUEUED, JobState.CANCELLED}


def test_only_running_jobs_finish() -> None:
    for state in JobState:
        for end in (JobState.SUCCEEDED, JobState.RETRYING):
            assert can_transition(state, end) == (state is JobState.RUNNING)


def test_only_running_jobs_and_paused_jobs_over_budget_fail() -> None:
    assert {s for s in JobState if can_transition(s, JobState.FAILED)} == {
        JobState.RUNNING,
        JobState.PAUSED,
    }


def test_only_claimable_states_start_running() -> None:
    starters = {s for s in JobState if can_transition(s, JobState.RUNNING)}
    assert starters == CLAIMABLE


def test_every_active_state_and_failed_can_be_cancelled() -> None:
    cancellable = {s for s in JobState if can_transition(s, JobState.CANCELLED)}
    assert cancellable == ACTIVE | {JobState.FAILED}


def test_terminal_and_active_partition_the_states() -> None:
    assert set(JobState) == TERMINAL | ACTIVE
    assert not TERMINAL & ACTIVE
