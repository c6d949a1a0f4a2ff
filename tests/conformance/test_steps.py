"""Durable steps, sleeps, waits and signals (:class:`~tether.store.protocols.StepStore`).

A step is written under the job's lease, so a stale token writes nothing; a sleep or a
wait parks the job (queued until it wakes, no lease, its attempt unspent); a signal
takes the job's row lock as a park does, so a signal racing a park never loses its
wake-up. Time is moved by backdating ``wakes_at`` and ``run_at`` in the database.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta

import pytest

from tether.config import DAY, RetentionConfig
from tether.errors import (
    DuplicateStepError,
    IllegalTransitionError,
    JobNotFoundError,
    SignalConflictError,
)
from tether.job import Job, StepInfo
from tether.maintenance import Pruner
from tether.states import JobState
from tether.store import Store
from tether.store.common.steps import signal_step

from .support import SLACK, Db, assert_between, claim_one, outcome, running_job

SIGNAL = "approved"
WAIT = signal_step(SIGNAL)  # the step name a wait for SIGNAL goes under


async def step_of(store: Store, job_id: int, name: str) -> StepInfo:
    steps = {s.name: s for s in await store.steps(job_id)}
    assert name in steps, steps
    return steps[name]


async def current(store: Store, job_id: int) -> Job:
    job = await store.get(job_id)
    assert job is not None
    return job


def backdate_step(db: Db, job_id: int, name: str, seconds: float) -> None:
    """Move a step's ``wakes_at`` to database-now minus ``seconds``."""
    if db.dialect == "sqlite":
        expr = "((julianday('now') - 2440587.5) * 86400.0) - %s"
    else:
        expr = "now() - make_interval(secs => %s)"
    db.execute(
        f"UPDATE tether_steps SET wakes_at = {expr} WHERE job_id = %s AND name = %s",
        (seconds, job_id, name),
    )


async def reclaim(store: Store, job: Job) -> Job:
    """Claim ``job`` again (alone in its queue), as its next attempt."""
    again = await claim_one(store, queue=job.queue, task=job.task)
    assert again.id == job.id
    return again


async def wake_and_reclaim(store: Store, db: Db, job: Job, name: str) -> Job:
    """Let the parked ``job``'s sleep or wait ``name`` run out, and claim it again."""
    backdate_step(db, job.id, name, 1.0)
    db.make_due(job.id)
    return await reclaim(store, job)


async def sleep(store: Store, job: Job, seconds: float = 30.0, name: str = "nap") -> str:
    found = await store.wait("w1", job.id, job.lease_token, name, seconds=seconds, reason="zz")
    return found.outcome


async def wait_for(store: Store, job: Job, seconds: float | None = None) -> tuple[str, str | None]:
    found = await store.wait(
        "w1", job.id, job.lease_token, WAIT, signal=SIGNAL, seconds=seconds, reason="waiting"
    )
    return found.outcome, found.payload_json


def decoded(payload: str | None) -> object:
    return None if payload is None else json.loads(payload)


# -- steps -----------------------------------------------------------------------------


async def test_a_step_saved_under_the_current_token_is_listed(store: Store) -> None:
    job = await running_job(store)
    assert await store.save_step(job.id, job.lease_token, "fetch", '{"rows": 3}', took=0.5)
    assert await store.save_step(job.id, job.lease_token, "load", "[1, 2]", usage=4)
    steps = await store.steps(job.id)
    assert [(s.name, s.kind, s.state, s.result, s.attempt) for s in steps] == [
        ("fetch", "step", "done", {"rows": 3}, 1),
        ("load", "step", "done", [1, 2], 1),
    ]
    fetch, load = steps
    assert fetch.finished_at is not None and fetch.wakes_at is None
    assert fetch.finished_at - fetch.started_at >= timedelta(seconds=0.5) - SLACK
    assert (fetch.usage, load.usage) == (0, 4)


async def test_a_step_saved_with_a_token_a_rescue_replaced_is_refused(store: Store, db: Db) -> None:
    job = await running_job(store, lease=60)
    db.expire_lease(job.id)
    [rescued] = await store.rescue()
    assert rescued.id == job.id and rescued.lease_token == job.lease_token + 1
    assert await store.save_step(job.id, job.lease_token, "fetch", "1") is False
    assert await store.steps(job.id) == []

    # Claimed again: the new attempt's token writes, the old one still does not.
    db.make_due(job.id)
    again = await reclaim(store, job)
    assert await store.save_step(job.id, job.lease_token, "fetch", "1") is False
    assert await store.steps(job.id) == []
    assert await store.save_step(again.id, again.lease_token, "fetch", "2")
    [step] = await store.steps(job.id)
    assert (step.result, step.attempt) == (2, again.attempt)


async def test_a_step_saved_with_a_wrong_token_or_after_the_finish_is_refused(
    store: Store,
) -> None:
    job = await running_job(store)
    for token in (job.lease_token - 1, job.lease_token + 1):
        assert await store.save_step(job.id, token, "fetch", "1") is False
    assert await store.finish("w1", [outcome(job, JobState.SUCCEEDED)]) == {job.id}
    assert await store.save_step(job.id, job.lease_token, "fetch", "1") is False
    assert await store.steps(job.id) == []


async def test_a_step_already_done_raises_and_keeps_its_first_result(store: Store) -> None:
    job = await running_job(store)
    assert await store.save_step(job.id, job.lease_token, "fetch", '"first"', usage=2)
    with pytest.raises(DuplicateStepError):
        await store.save_step(job.id, job.lease_token, "fetch", '"second"', usage=5)
    [step] = await store.steps(job.id)
    assert (step.result, step.usage) == ("first", 2)


async def test_fence_holds_only_for_the_current_token_of_a_running_job(store: Store) -> None:
    job = await running_job(store)
    assert await store.fence(job.id, job.lease_token) is True
    assert await store.fence(job.id, job.lease_token - 1) is False
    assert await store.fence(job.id, job.lease_token + 1) is False
    assert await store.fence(job.id + 1000, job.lease_token) is False
    assert await store.finish("w1", [outcome(job, JobState.SUCCEEDED)]) == {job.id}
    assert await store.fence(job.id, job.lease_token) is False


# -- sleeps ----------------------------------------------------------------------------


async def test_a_sleep_parks_the_job_queued_until_it_wakes_with_its_attempt_unspent(
    store: Store, db: Db
) -> None:
    job = await running_job(store, max_attempts=1)
    before = db.now()
    assert await sleep(store, job, 30.0) == "parked"
    after = db.now()
    parked = await current(store, job.id)
    assert parked.state is JobState.QUEUED
    assert parked.attempt == job.attempt - 1
    assert parked.lease_expires_at is None
    assert_between(parked.run_at, before + timedelta(seconds=30), after + timedelta(seconds=30))
    step = await step_of(store, job.id, "nap")
    assert (step.kind, step.state, step.finished_at) == ("sleep", "waiting", None)
    assert_between(step.wakes_at, before + timedelta(seconds=30), after + timedelta(seconds=30))
    # Not claimable until it wakes.
    assert await store.claim("w1", [job.queue], [job.task], 1, 60) == []

    # Its time passes; the next attempt (the same one, unspent) finds the sleep over.
    again = await wake_and_reclaim(store, db, job, "nap")
    assert again.attempt == job.attempt and again.lease_token > job.lease_token
    assert await sleep(store, again, 30.0) == "done"
    step = await step_of(store, job.id, "nap")
    assert step.state == "done" and step.finished_at is not None
    # Asked again (a replay), it stays done and parks nothing.
    assert await sleep(store, again, 30.0) == "done"
    assert (await current(store, job.id)).state is JobState.RUNNING


async def test_a_sleep_woken_early_parks_again_until_its_first_deadline(
    store: Store, db: Db
) -> None:
    job = await running_job(store)
    assert await sleep(store, job, 3600.0) == "parked"
    # Claimed again long before the hour is over (say, resumed after a pause): the
    # sleep keeps the deadline it was given first, about ten seconds from now.
    backdate_step(db, job.id, "nap", -10.0)
    db.make_due(job.id)
    again = await reclaim(store, job)
    before = db.now()
    assert await sleep(store, again, 3600.0) == "parked"
    after = db.now()
    parked = await current(store, job.id)
    assert parked.state is JobState.QUEUED
    assert_between(parked.run_at, before, after + timedelta(seconds=10))
    assert parked.run_at is not None and parked.run_at >= before + timedelta(seconds=9)


async def test_a_sleep_of_no_time_is_done_at_once(store: Store) -> None:
    job = await running_job(store)
    assert await sleep(store, job, 0.0) == "done"
    assert (await current(store, job.id)).state is JobState.RUNNING
    assert (await step_of(store, job.id, "nap")).state == "done"


async def test_a_wait_with_a_stale_token_is_lost_and_writes_nothing(store: Store) -> None:
    job = await running_job(store)
    found = await store.wait("w1", job.id, job.lease_token + 1, "nap", seconds=30.0, reason="zz")
    assert found.outcome == "lost"
    assert await store.steps(job.id) == []
    assert (await current(store, job.id)).state is JobState.RUNNING


async def test_a_park_with_a_cancel_pending_cancels_the_job(store: Store) -> None:
    job = await running_job(store)
    await store.request_cancel(job.id, "stop", False, "alice")
    assert await sleep(store, job) == "parked"
    cancelled = await current(store, job.id)
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.finished_at is not None and cancelled.lease_expires_at is None
    assert await store.claim("w1", [job.queue], [job.task], 1, 60) == []


async def test_a_park_with_a_pause_pending_pauses_the_job(store: Store) -> None:
    job = await running_job(store)
    await store.request_pause(job.id, "hold", "alice")
    assert await wait_for(store, job) == ("parked", None)
    assert (await current(store, job.id)).state is JobState.PAUSED


# -- waits for signals -----------------------------------------------------------------


async def test_a_wait_for_a_signal_already_sent_is_done_with_its_payload(store: Store) -> None:
    job = await running_job(store)
    assert await store.signal(job.id, SIGNAL, '{"by": "bob"}', "bob") == "kept"
    state, payload = await wait_for(store, job, 60.0)
    assert state == "done" and decoded(payload) == {"by": "bob"}
    running = await current(store, job.id)
    assert running.state is JobState.RUNNING and running.lease_token == job.lease_token
    step = await step_of(store, job.id, WAIT)
    assert (step.kind, step.state, step.result) == ("signal", "done", {"by": "bob"})


async def test_a_wait_parks_until_its_signal_which_makes_the_job_claimable_at_once(
    store: Store, db: Db
) -> None:
    job = await running_job(store)
    assert await wait_for(store, job) == ("parked", None)
    parked = await current(store, job.id)
    assert parked.state is JobState.QUEUED and parked.attempt == job.attempt - 1
    assert parked.run_at is not None and parked.run_at > db.now() + timedelta(days=365)
    step = await step_of(store, job.id, WAIT)
    assert (step.kind, step.state, step.wakes_at) == ("signal", "waiting", None)
    assert await store.claim("w1", [job.queue], [job.task], 1, 60) == []

    assert await store.signal(job.id, SIGNAL, "[7]", "bob") == "woke"
    woken = await current(store, job.id)
    assert woken.state is JobState.QUEUED
    assert woken.run_at is not None and woken.run_at <= db.now() + SLACK
    again = await reclaim(store, job)  # at once, without moving a clock
    assert again.attempt == job.attempt
    state, payload = await wait_for(store, again)
    assert state == "done" and decoded(payload) == [7]
    assert (await step_of(store, job.id, WAIT)).state == "done"


async def test_a_signal_to_a_parked_paused_job_lets_resume_run_it_at_once(
    store: Store, db: Db
) -> None:
    job = await running_job(store)
    assert await wait_for(store, job) == ("parked", None)
    await store.request_pause(job.id, "hold", "alice")
    assert (await current(store, job.id)).state is JobState.PAUSED
    assert await store.signal(job.id, SIGNAL, "1", "bob") == "woke"
    paused = await current(store, job.id)
    assert paused.state is JobState.PAUSED
    assert paused.run_at is not None and paused.run_at <= db.now() + SLACK
    assert await store.claim("w1", [job.queue], [job.task], 1, 60) == []
    await store.resume(job.id, None, "alice")
    again = await reclaim(store, job)
    assert await wait_for(store, again) == ("done", "1")


async def test_a_wait_past_its_timeout_times_out_and_refuses_the_late_signal(
    store: Store, db: Db
) -> None:
    job = await running_job(store)
    before = db.now()
    assert await wait_for(store, job, 30.0) == ("parked", None)
    after = db.now()
    step = await step_of(store, job.id, WAIT)
    assert_between(step.wakes_at, before + timedelta(seconds=30), after + timedelta(seconds=30))
    again = await wake_and_reclaim(store, db, job, WAIT)
    assert await wait_for(store, again, 30.0) == ("timed_out", None)
    step = await step_of(store, job.id, WAIT)
    assert step.state == "timed_out" and step.finished_at is not None
    assert (await current(store, job.id)).state is JobState.RUNNING
    # Asked again (a replay), it stays timed out.
    assert await wait_for(store, again, 30.0) == ("timed_out", None)

    with pytest.raises(IllegalTransitionError):
        await store.signal(job.id, SIGNAL, "1", "bob")
    assert db.execute("SELECT COUNT(*) FROM tether_signals WHERE job_id = %s", (job.id,)) == [(0,)]
    # Another signal's name is still welcome.
    assert await store.signal(job.id, "other", "1", "bob") == "kept"


async def test_a_wait_of_no_time_without_its_signal_times_out_at_once(store: Store) -> None:
    job = await running_job(store)
    assert await wait_for(store, job, 0.0) == ("timed_out", None)
    assert (await step_of(store, job.id, WAIT)).state == "timed_out"
    assert (await current(store, job.id)).state is JobState.RUNNING


async def test_a_signal_sent_after_the_deadline_but_before_the_look_is_delivered(
    store: Store, db: Db
) -> None:
    job = await running_job(store)
    assert await wait_for(store, job, 30.0) == ("parked", None)
    backdate_step(db, job.id, WAIT, 1.0)
    assert await store.signal(job.id, SIGNAL, '"late"', "bob") == "woke"
    again = await reclaim(store, job)
    assert await wait_for(store, again, 30.0) == ("done", '"late"')


# -- signals ---------------------------------------------------------------------------


async def test_a_signal_to_no_job_raises_job_not_found(store: Store) -> None:
    with pytest.raises(JobNotFoundError):
        await store.signal(424242, SIGNAL, "1", "bob")


@pytest.mark.parametrize("end", [JobState.SUCCEEDED, JobState.CANCELLED])
async def test_a_signal_to_a_finished_job_is_illegal(store: Store, db: Db, end: JobState) -> None:
    job = await running_job(store)
    assert await store.finish("w1", [outcome(job, end)]) == {job.id}
    with pytest.raises(IllegalTransitionError):
        await store.signal(job.id, SIGNAL, "1", "bob")
    assert db.execute("SELECT COUNT(*) FROM tether_signals WHERE job_id = %s", (job.id,)) == [(0,)]


async def test_a_signal_sent_twice_is_a_duplicate_and_another_payload_a_conflict(
    store: Store, db: Db
) -> None:
    job = await running_job(store)
    assert await wait_for(store, job) == ("parked", None)
    assert await store.signal(job.id, SIGNAL, '{"n":1}', "bob") == "woke"
    woken = await current(store, job.id)
    assert await store.signal(job.id, SIGNAL, '{"n":1}', "carol") == "duplicate"
    with pytest.raises(SignalConflictError):
        await store.signal(job.id, SIGNAL, '{"n":2}', "carol")
    with pytest.raises(SignalConflictError):
        await store.signal(job.id, SIGNAL, None, "carol")
    assert await current(store, job.id) == woken
    rows = db.execute("SELECT name, sent_by FROM tether_signals WHERE job_id = %s", (job.id,))
    assert rows == [(SIGNAL, "bob")]
    again = await reclaim(store, job)
    state, payload = await wait_for(store, again)
    assert state == "done" and decoded(payload) == {"n": 1}


@pytest.mark.parametrize(
    ("first", "again", "same"),
    [
        ('{"a":1,"b":[2,3]}', '{"b": [2, 3], "a": 1}', True),
        ("1", "1.0", True),
        ("true", "1", False),
        ('{"a":1}', '{"a":1,"b":null}', False),
        ('"x"', '"y"', False),
    ],
    ids=["key order and spacing", "1 and 1.0", "true and 1", "a key more", "strings"],
)
async def test_a_signal_sent_again_is_compared_as_json_not_as_text(
    store: Store, first: str, again: str, same: bool
) -> None:
    job = await running_job(store)
    assert await store.signal(job.id, SIGNAL, first, "bob") == "kept"
    if same:
        assert await store.signal(job.id, SIGNAL, again, "bob") == "duplicate"
    else:
        with pytest.raises(SignalConflictError):
            await store.signal(job.id, SIGNAL, again, "bob")
    state, payload = await wait_for(store, job)
    assert state == "done" and decoded(payload) == json.loads(first)


async def test_a_signal_without_a_payload_is_delivered_as_none(store: Store) -> None:
    job = await running_job(store)
    assert await store.signal(job.id, SIGNAL, None, None) == "kept"
    assert await store.signal(job.id, SIGNAL, None, None) == "duplicate"
    assert await wait_for(store, job) == ("done", None)


async def test_a_signal_to_a_job_waiting_for_another_keeps_it_parked(store: Store, db: Db) -> None:
    job = await running_job(store)
    assert await wait_for(store, job) == ("parked", None)
    parked = await current(store, job.id)
    assert await store.signal(job.id, "unrelated", "1", "bob") == "kept"
    assert await current(store, job.id) == parked
    assert await store.claim("w1", [job.queue], [job.task], 1, 60) == []


# -- deletion and retention ------------------------------------------------------------


def count(db: Db, table: str, job_id: int) -> int:
    return int(db.execute(f"SELECT COUNT(*) FROM {table} WHERE job_id = %s", (job_id,))[0][0])


async def with_step_and_signal(store: Store) -> Job:
    """A running job with one step done and one signal kept for it."""
    job = await running_job(store)
    assert await store.save_step(job.id, job.lease_token, "fetch", "1")
    assert await store.signal(job.id, SIGNAL, "1", "bob") == "kept"
    return job


async def test_deleting_a_job_removes_its_steps_and_signals(store: Store, db: Db) -> None:
    job = await with_step_and_signal(store)
    keep = await with_step_and_signal(store)
    await store.delete(job.id, "alice")
    assert count(db, "tether_steps", job.id) == 0
    assert count(db, "tether_signals", job.id) == 0
    assert count(db, "tether_steps", keep.id) == 1
    assert count(db, "tether_signals", keep.id) == 1


async def test_pruning_a_job_removes_its_steps_and_signals(store: Store, db: Db) -> None:
    old = await with_step_and_signal(store)
    young = await with_step_and_signal(store)
    for job in (old, young):
        assert await store.finish("w1", [outcome(job, JobState.SUCCEEDED)]) == {job.id}
    db.set_ago("tether_jobs", "finished_at", old.id, 2 * DAY)
    report = await Pruner(store, RetentionConfig(batch_pause=0)).prune()
    counts = report.counts
    assert counts["jobs"] == 1 and counts["steps"] == 1 and counts["signals"] == 1
    assert count(db, "tether_steps", old.id) == 0
    assert count(db, "tether_signals", old.id) == 0
    assert count(db, "tether_steps", young.id) == 1
    assert count(db, "tether_signals", young.id) == 1


# -- a signal racing a park ------------------------------------------------------------

ROUNDS = 25


async def test_a_signal_racing_a_park_never_loses_its_wake_up(
    store: Store, db: Db, make_store: Callable[[], Store]
) -> None:
    """The worker parks through one store while a person signals through another: the
    wait sees the signal (done), or the signal finds the job parked and wakes it."""
    sender = make_store()
    await sender.open()
    seen: set[tuple[str, str]] = set()
    for n in range(ROUNDS):
        job = await running_job(store)
        payload = json.dumps({"round": n})
        park = wait_for(store, job)
        send = sender.signal(job.id, SIGNAL, payload, "bob")
        if n % 2:
            sent, (state, got) = await asyncio.gather(send, park)
        else:
            (state, got), sent = await asyncio.gather(park, send)
        seen.add((state, sent))
        now = db.now()
        after = await current(store, job.id)
        if state == "done":
            assert sent == "kept" and decoded(got) == {"round": n}
            assert after.state is JobState.RUNNING
        else:
            assert (state, sent) == ("parked", "woke"), n
            assert after.state is JobState.QUEUED
            assert after.run_at is not None and after.run_at <= now + SLACK, n
            again = await reclaim(store, job)
            state, got = await wait_for(store, again)
            assert state == "done" and decoded(got) == {"round": n}
    assert seen <= {("done", "kept"), ("parked", "woke")}
