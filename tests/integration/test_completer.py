"""The completer: outcomes written in batches, each caller told whether its own was
accepted (both stores)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from tests.conformance.support import outcome, running_job
from tether.job import Outcome
from tether.states import JobState
from tether.store import Store
from tether.worker.completer import Completer


async def test_each_outcome_hears_whether_it_was_accepted_even_if_another_callback_fails(
    store: Store,
) -> None:
    held = await running_job(store, "w1", queue="q")
    lost = await running_job(store, "w1", queue="q")
    after = await running_job(store, "w1", queue="q")
    heard: dict[int, bool] = {}

    def broken(accepted: bool) -> None:
        raise RuntimeError("bookkeeping bug")

    completer = Completer(store, "w1")
    completer.submit(outcome(held, JobState.SUCCEEDED), broken)
    completer.submit(
        Outcome(lost.id, lost.lease_token + 1, JobState.SUCCEEDED),
        lambda ok: heard.__setitem__(lost.id, ok),
    )
    completer.submit(outcome(after, JobState.SUCCEEDED), lambda ok: heard.__setitem__(after.id, ok))
    assert await completer.run_once() == 3
    assert heard == {lost.id: False, after.id: True}
    assert not completer.pending
    done = await store.get(held.id)
    assert done is not None and done.state is JobState.SUCCEEDED


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_an_outcome_whose_limit_row_is_held_waits_alone(store: Store, db_url: str) -> None:
    # Ending a keyed job updates its key's counted limit: with that row held by another
    # client, the batch gives up after the limit's lock bound (1 s, in SQL), and the
    # other outcomes go in at once.
    keyed = await running_job(store, "w1", key="k", limits=("key:k",))
    plain = await running_job(store, "w1")
    completer = Completer(store, "w1")
    completer.submit(outcome(keyed, JobState.SUCCEEDED))
    completer.submit(outcome(plain, JobState.SUCCEEDED))
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT 1 FROM tether_limits WHERE name = 'key:k' FOR UPDATE")
        assert await asyncio.wait_for(completer.round(), 10) is None
        assert [o.job_id for o, _ in completer.pending] == [keyed.id]
        assert (await store.get(plain.id)).state is JobState.SUCCEEDED  # type: ignore[union-attr]
        holder.rollback()
    await completer.round()
    assert not completer.pending
    assert (await store.get(keyed.id)).state is JobState.SUCCEEDED  # type: ignore[union-attr]
