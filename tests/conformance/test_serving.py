"""Jobs that no live worker can run are named, with why (worker rows record what they serve)."""

from __future__ import annotations

from tether import App
from tether.metrics import render
from tether.store import Store

from .support import Db, enqueue_one, running_job


def _app(db_url: str) -> App:
    app = App(db_url)

    @app.task(name="crawl")
    async def crawl(ctx: object) -> None: ...

    @app.task(name="index", queue="search")
    async def index(ctx: object) -> None: ...

    return app


async def test_worker_row_records_the_queues_and_tasks_it_serves(store: Store) -> None:
    await store.register_worker("w1", None, "h", 1, None, ["a", "b"], 4, tasks=["t2", "t1"])
    await store.register_worker("w0", None, "h", 2, None, ["a"], 4)
    workers = {w.id: w for w in await store.list_workers()}
    assert (workers["w1"].queues, workers["w1"].tasks) == (("a", "b"), ("t1", "t2"))
    # A row without tasks (a worker that predates them) is taken to serve every task.
    assert (workers["w0"].queues, workers["w0"].tasks) == (("a",), None)


async def test_waiting_jobs_are_counted_by_queue_and_task(store: Store) -> None:
    await enqueue_one(store, task="a", queue="q")
    await enqueue_one(store, task="a", queue="q")
    await enqueue_one(store, task="b", queue="r")
    await running_job(store, "w1", task="a", queue="p")
    assert await store.waiting_by_task() == {("q", "a"): 2, ("r", "b"): 1}


async def test_a_job_no_live_worker_serves_says_so(db_url: str, db: Db) -> None:
    app = _app(db_url)
    try:
        store = await app.store()
        crawl = await app.enqueue("crawl")
        index = await app.enqueue("index")
        # No worker at all: both wait forever, and say so.
        assert await app.jobs.unserved_reason(crawl) == (
            "no worker serves task crawl on queue default (no worker is running)"
        )
        # A worker on the default queue that knows only crawl.
        await store.register_worker("w1", None, "h", 1, None, ["default"], 4, tasks=["crawl"])
        assert await app.jobs.unserved_reason(crawl) is None
        assert await app.jobs.unserved_reason(index) == (
            "no worker serves task index on queue search (no worker listens on this queue)"
        )
        # A worker on the search queue that does not know index.
        await store.register_worker("w2", None, "h", 2, None, ["search"], 4, tasks=["crawl"])
        [u] = await app.admin.unserved()
        assert (u.queue, u.task, u.jobs) == ("search", "index", 1)
        assert u.reason.startswith("no worker serves task index on queue search")
        queues = {q.name: q for q in await app.queues.list()}
        assert queues["default"].unserved == ()
        assert queues["search"].unserved == (u,)
        text = (await render(app)).decode()
        assert 'tether_jobs_unserved{queue="search",task="index"} 1.0' in text

        # One that serves it: nothing is unserved. Once it stops, the job is again.
        await store.register_worker("w3", None, "h", 3, None, ["search"], 4, tasks=["index"])
        assert await app.admin.unserved() == []
        await store.set_worker_state("w3", "stopped")
        assert [u.task for u in await app.admin.unserved()] == ["index"]
        # An active row whose heartbeat went silent long ago does not serve either.
        await store.register_worker("w4", None, "h", 4, None, ["search"], 4, tasks=["index"])
        assert await app.admin.unserved() == []
        db.set_ago("tether_workers", "heartbeat_at", "w4", 3600)
        assert [u.task for u in await app.admin.unserved()] == ["index"]
    finally:
        await app.close()


async def test_a_job_that_is_not_waiting_is_never_flagged(db_url: str) -> None:
    app = _app(db_url)
    try:
        job = await app.enqueue("index")
        paused = await app.jobs.pause(job.id)
        assert await app.jobs.unserved_reason(paused) is None
    finally:
        await app.close()
