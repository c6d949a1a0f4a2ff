"""Listening: a store hears of other processes' commits through its hints."""

from __future__ import annotations

from collections.abc import Callable

from tether import hints as h
from tether.store import Store

from ..helpers import eventually
from .support import fresh_queue, new_job


async def test_a_listening_store_hears_another_stores_enqueue(
    store: Store, make_store: Callable[[], Store]
) -> None:
    await store.listen()
    await store.listen()  # idempotent: still one watch
    other = make_store()
    queue = fresh_queue()
    with store.hints.subscribe(h.ENQUEUED, [queue]) as sub:

        async def heard() -> bool:
            await other.enqueue([new_job(queue=queue)])
            return bool(await sub.get(0.5))

        await eventually(heard)
