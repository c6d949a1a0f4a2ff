"""The completer: outcomes written in batches, each caller told whether its own was
accepted (both stores)."""

from __future__ import annotations

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
