"""Property: any sequence of store operations on one job follows the state machine.

Each example drives one fresh job (in its own queue) through a random mix of claims,
heartbeats, checkpoints, finishes (with fresh or stale tokens), cancel requests and
lease expiries followed by a rescue. After every step the row must match a small model
of the rules; at the end its events must form one legal chain with at most one final
event (succeeded or cancelled), which comes last. The only terminal event that may be
followed by another is a failure, dismissed by a cancel (``failed -> cancelled``).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.job import Beat, ControlRequest, Outcome
from tether.states import TERMINAL, TRANSITIONS, JobState
from tether.store import Store

from .support import Db, new_job

Q, R, RT, S, F, C = (
    JobState.QUEUED,
    JobState.RUNNING,
    JobState.RETRYING,
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
)

OPS = st.one_of(
    st.tuples(st.just("claim")),
    st.tuples(st.just("heartbeat"), st.booleans()),
    st.tuples(st.just("checkpoint"), st.booleans()),
    st.tuples(st.just("finish"), st.sampled_from([S, F, RT, Q, C]), st.booleans()),
    st.tuples(st.just("cancel"), st.booleans()),
    st.tuples(st.just("expire")),
)

FINAL = frozenset({S, C})
"""States nothing leaves: ``failed`` may still be retried or dismissed."""

_queues = itertools.count(1)


@dataclass
class Model:
    """What the rules say the job's row holds."""

    state: JobState = Q
    token: int = 0
    attempt: int = 0
    cancel: bool = False
    force: bool = False
    checkpoint: Any = None


async def step(
    store: Store, db: Db, job_id: int, queue: str, m: Model, op: tuple[Any, ...]
) -> None:
    """Apply ``op`` to the store and to the model, checking what the store returns."""
    kind = op[0]
    running = m.state is R
    if kind == "claim":
        got = await store.claim("w", [queue], ["t"], 5, 60)
        if m.state in (Q, RT):
            assert [j.id for j in got] == [job_id]
            m.state, m.token, m.attempt = R, m.token + 1, m.attempt + 1
        else:
            assert got == []
    elif kind == "heartbeat":
        token = m.token if op[1] else m.token - 1
        beat = await store.heartbeat("w", [Beat(job_id, token)], 60)
        alive = running and op[1]
        assert beat.alive == ({job_id} if alive else set())
        wanted = (ControlRequest(job_id, True, m.force),) if alive and m.cancel else ()
        assert beat.requests == wanted
    elif kind == "checkpoint":
        token = m.token if op[1] else m.token - 1
        value = {"step": m.attempt, "token": token}
        saved = await store.save_checkpoint(job_id, token, json.dumps(value))
        assert saved is (running and op[1])
        if saved:
            m.checkpoint = value
    elif kind == "finish":
        target, fresh = op[1], op[2]
        token = m.token if fresh else m.token + 1
        accepted = await store.finish("w", [Outcome(job_id, token, target)])
        assert accepted == ({job_id} if running and fresh else set())
        if accepted:
            m.state = C if m.cancel and target in (F, RT, Q) else target
            m.attempt -= 1 if target is Q else 0
    elif kind == "cancel":
        job = await store.request_cancel(job_id, "prop", op[1], "test")
        # Everything but a final job takes the request; a failed one is dismissed.
        if m.state not in FINAL:
            m.cancel, m.force = True, m.force or op[1]
            if not running:
                m.state = C
        assert job.state is m.state
    elif kind == "expire":
        if running:
            db.expire_lease(job_id)
        rescued = [j for j in await store.rescue() if j.id == job_id]
        if running:
            m.state = C if m.cancel else F if m.attempt >= 3 else RT
            m.token += 1
            assert [j.state for j in rescued] == [m.state]
        else:
            assert rescued == []


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(OPS, min_size=1, max_size=14))
async def test_random_operations_follow_the_state_machine(
    store: Store, db: Db, ops: list[tuple[Any, ...]]
) -> None:
    queue = f"prop{next(_queues)}"
    [job] = await store.enqueue([new_job(queue=queue, max_attempts=3)])
    m = Model()
    for op in ops:
        await step(store, db, job.id, queue, m, op)
        row = await store.get(job.id)
        assert row is not None
        assert row.state is m.state, op
        assert (row.lease_token, row.attempt) == (m.token, m.attempt), op
        assert row.checkpoint == m.checkpoint
        assert (row.cancel_requested_at is not None, row.cancel_force) == (m.cancel, m.force)
        assert (row.lease_expires_at is not None) == (row.state is R)
        assert (row.finished_at is not None) == (row.state in TERMINAL)

    events = await store.events(job.id)
    assert (events[0].from_state, events[0].to_state) == (None, Q)
    for prev, ev in itertools.pairwise(events):
        assert ev.from_state is prev.to_state
        assert ev.to_state in TRANSITIONS[prev.to_state], (prev.to_state, ev.to_state)
    # At most one final event, and it is the last; a failure can only be dismissed.
    final = [i for i, e in enumerate(events) if e.to_state in FINAL]
    assert final in ([], [len(events) - 1])
    terminal = [e.to_state for e in events if e.to_state in TERMINAL]
    assert terminal in ([], [S], [C], [F], [F, C])
    assert events[-1].to_state is m.state
