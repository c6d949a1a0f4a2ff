"""``GET /api/events``: a Server-Sent Events stream of job transitions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse

from tether import strictint
from tether.feed import FeedFilter
from tether.job import FeedEvent
from tether.states import JobState
from tether.web.models import MAX_ID, Transition
from tether.web.routes import ERRORS
from tether.web.routes.jobs import NameQuery
from tether.web.security import ALL_ROLES, Caller, require

router = APIRouter(tags=["events"], responses=ERRORS)
log = logging.getLogger("tether.web")
BACKLOG = 1000  # transitions buffered for a slow client before the feed waits for it
CLOSE_WITHIN = 5.0  # seconds a closing stream may take to stop its feed

DESCRIPTION = """\
Server-Sent Events, one per job transition:

```
id: 1234
event: transition
data: {"event_id": 1234, "job_id": 7, "from_state": "running", "to_state": "cancelled", ...}
```

`data` is a `Transition` (see the schemas). Filter by `job`, `queue` and `state` (the state
entered; repeatable); members see their own jobs only. Reconnect with `Last-Event-ID` (or
`since`) to resume without gaps. Transitions arrive within milliseconds on PostgreSQL
(LISTEN/NOTIFY), and within `poll` seconds otherwise. Idle streams get a comment line every
few seconds. `limit` and `timeout` end the stream after that many events or seconds.
"""


def _message(item: FeedEvent) -> str:
    ev = item.event
    data = Transition(
        event_id=item.id,
        job_id=ev.job_id,
        from_state=ev.from_state,
        to_state=ev.to_state,
        at=ev.at,
        queue=item.queue,
        task=item.task,
        owner=item.owner,
        worker_id=ev.worker_id,
        actor=ev.actor,
        reason=ev.reason,
    ).model_dump_json()
    return f"id: {ev.id}\nevent: transition\ndata: {data}\n\n"


@router.get(
    "/events",
    summary="Live job transitions (Server-Sent Events)",
    description=DESCRIPTION,
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
)
async def events(
    request: Request,
    caller: Annotated[Caller, Depends(require("events.read", ALL_ROLES))],
    job: Annotated[int | None, Query(ge=1, le=MAX_ID, description="Only this job.")] = None,
    queue: NameQuery = None,
    state: Annotated[list[JobState] | None, Query(description="State entered.")] = None,
    since: Annotated[int | None, Query(ge=0, le=MAX_ID, description="Last event id seen.")] = None,
    poll: Annotated[
        float, Query(gt=0, le=60, description="Fallback poll seconds (the server sets a floor).")
    ] = 1.0,
    limit: Annotated[int | None, Query(ge=1, le=10**6, description="End after N events.")] = None,
    timeout: Annotated[
        float | None, Query(gt=0, le=86400, description="End after N seconds.")
    ] = None,
    last_event_id: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> StreamingResponse:
    if job is not None:
        async with caller.attempt(f"job:{job}", mutation=False):
            await caller.job(job)
    after = since
    resume_at = strictint.parse(last_event_id, 0, MAX_ID)
    if resume_at is not None:
        after = resume_at
    settings = caller.api.settings
    flt = FeedFilter(
        job_id=job,
        queue=queue,
        owner=caller.principal.owner_filter,
        states=tuple(s.value for s in state) if state else None,
    )
    poll = max(poll, settings.min_poll_interval)
    feed = await caller.app.jobs.feed(flt, after_id=after, poll=poll)
    return StreamingResponse(
        _stream(request, feed, limit, timeout, settings.sse_keepalive),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(
    request: Request,
    feed: AsyncGenerator[FeedEvent, None],
    limit: int | None,
    timeout: float | None,
    keepalive: float,
) -> AsyncIterator[str]:
    """Pump the feed into a bounded buffer, so the stream can send keep-alives, notice a
    client that left, and end on time without cancelling the feed mid-read."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    buffer: asyncio.Queue[FeedEvent] = asyncio.Queue(BACKLOG)

    async def pump() -> None:
        async for item in feed:
            await buffer.put(item)

    pumping = asyncio.create_task(pump(), name="tether-sse-feed")
    getting: asyncio.Future[FeedEvent] | None = None
    sent = 0
    try:
        yield ": stream open\n\n"
        while limit is None or sent < limit:
            wait = keepalive
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    break
            getting = asyncio.ensure_future(buffer.get())
            done, _ = await asyncio.wait(
                {getting, pumping}, timeout=wait, return_when="FIRST_COMPLETED"
            )
            if getting in done:
                yield _message(getting.result())
                sent += 1
                continue
            getting.cancel()
            if pumping in done:
                # The feed failed (the database is gone): end the stream; the client
                # reconnects with Last-Event-ID and loses nothing.
                log.warning("event stream ended: %s", pumping.exception())
                break
            if await request.is_disconnected():
                break
            if deadline is None or loop.time() < deadline:
                yield ": keep-alive\n\n"
    finally:
        # A client that leaves cancels this generator at any await above, and the server
        # keeps cancelling every await of this block too. Shielded (and bounded), the
        # block cancels and reaps every task the stream started, so none is left pending
        # for the collector to destroy (logged at ERROR) and no query is interrupted
        # twice. A disconnect is normal: DEBUG only.
        with anyio.move_on_after(CLOSE_WITHIN, shield=True):
            for task in (getting, pumping):
                if task is not None and not task.done():
                    task.cancel()
            for task in (getting, pumping):
                if task is not None:
                    with contextlib.suppress(BaseException):
                        await task
            with contextlib.suppress(BaseException):
                await feed.aclose()
        log.debug("event stream closed after %d event(s)", sent)
