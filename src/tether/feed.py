"""The live feed of job transitions, for the API's Server-Sent Events and dashboards.

The feed tails ``tether_job_events`` by event id, so it sees every transition, claims
included, whoever made it. On PostgreSQL a job that simply runs and succeeds stores its
three transitions only while a feed says it follows (:data:`FOLLOW_TTL`, renewed every
:data:`FOLLOW_RENEW` seconds; a job's history derives them otherwise, migration 0028), so
a feed sees every transition from its start on, and one resumed after a gap may miss
such transitions made while no feed followed.

Hints only cut the wait short: on PostgreSQL a transition's NOTIFY (``tether_changed``,
``tether_enqueued``) wakes the feed within milliseconds, in any process; the poll is the
fallback (rule 1: the database is the truth).

Event ids come from a sequence, and on PostgreSQL a transaction that took an id can
commit after one that took a later id. A cursor that only moved forward would skip such
an event, so the feed re-reads the ids of the last ``grace`` seconds and delivers each id
once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from tether import hints as h
from tether.job import FeedEvent
from tether.store.protocols import FeedStore

PAGE = 500
GRACE = 2.0  # seconds an event id may commit after a later one
MIN_GAP = 0.05  # a busy queue wakes a feed often: batch what arrives meanwhile
FOLLOW_TTL = 30.0  # seconds a feed's word that it follows lasts
FOLLOW_RENEW = 10.0  # seconds between renewals of that word


@dataclass(frozen=True)
class FeedFilter:
    """Which transitions to deliver; ``None`` means any."""

    job_id: int | None = None
    queue: str | None = None
    owner: str | None = None
    states: tuple[str, ...] | None = None


async def follow(
    store: FeedStore,
    flt: FeedFilter,
    *,
    after_id: int | None = None,
    poll: float = 1.0,
    grace: float = GRACE,
    min_gap: float = MIN_GAP,
) -> AsyncGenerator[FeedEvent, None]:
    """Transitions as they happen, oldest first, forever.

    ``after_id`` resumes after that event id (an SSE ``Last-Event-ID``); by default the
    feed starts with the next transition. Reads are at least ``min_gap`` seconds apart,
    however many hints arrive, and at most ``poll`` seconds apart.
    """
    await store.listen()
    loop = asyncio.get_running_loop()
    # Subscribe before the first read, so a transition in between still wakes us.
    with (
        store.hints.subscribe(h.CHANGED) as changed,
        store.hints.subscribe(h.ENQUEUED) as enqueued,
    ):
        await store.announce_follower(FOLLOW_TTL)
        announced = loop.time()
        floor = after_id if after_id is not None else await store.last_event_id()
        seen: set[int] = set()  # ids above ``floor`` already delivered
        marks: deque[tuple[float, int]] = deque()  # (when, newest event id then)
        read_at = -min_gap
        while True:
            await asyncio.sleep(max(0.0, read_at + min_gap - loop.time()))
            read_at = loop.time()
            if read_at - announced >= FOLLOW_RENEW:
                await store.announce_follower(FOLLOW_TTL)
                announced = read_at
            marks.append((read_at, await store.last_event_id()))
            after = floor
            while True:
                page = await store.feed(
                    after,
                    job_id=flt.job_id,
                    queue=flt.queue,
                    owner=flt.owner,
                    states=flt.states,
                    limit=PAGE,
                )
                for item in page:
                    if item.id not in seen:
                        seen.add(item.id)
                        yield item
                if len(page) < PAGE:
                    break
                after = page[-1].id
            # Every id that existed ``grace`` seconds ago has committed (or never will):
            # the next reads start above it, however few events matched the filter.
            while marks and loop.time() - marks[0][0] > grace:
                floor = max(floor, marks.popleft()[1])
            seen = {i for i in seen if i > floor}
            await _wait_any((changed, enqueued), poll)


async def _wait_any(subs: Sequence[h.Subscription], timeout: float) -> None:
    """Wait until any subscription has news, or ``timeout`` seconds."""
    waits = [asyncio.ensure_future(s.get(timeout)) for s in subs]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        for w in waits:
            with contextlib.suppress(asyncio.CancelledError):
                await w
