"""Job meta: string labels set at enqueue, stored with the job, carried by the claim."""

from __future__ import annotations

from typing import Any

import pytest

from tether import App
from tether.errors import InvalidJobError
from tether.job import Job
from tether.store import Store
from tether.workflow import Workflow

from .support import Db, claim_one, enqueue_one, new_job, running_job

TRACE = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "congo=t61rcWkgMzE",
}


def _stored_meta(db: Db, job_id: int) -> Any:
    return db.execute("SELECT meta FROM tether_jobs WHERE id = %s", (job_id,))[0][0]


async def test_meta_is_stored_read_back_and_carried_by_the_claim(store: Store) -> None:
    job = await enqueue_one(store, meta=TRACE)
    assert job.meta == TRACE
    assert (await store.get(job.id)).meta == TRACE
    claimed = await claim_one(store)
    assert claimed.id == job.id
    assert claimed.meta == TRACE


async def test_a_job_without_meta_stores_null(store: Store, db: Db) -> None:
    job = await enqueue_one(store)
    assert job.meta is None
    assert _stored_meta(db, job.id) is None
    assert (await claim_one(store)).meta is None


async def test_a_bulk_enqueue_keeps_each_jobs_meta(store: Store) -> None:
    jobs = await store.enqueue(
        [new_job(meta={"n": str(i)}) if i % 2 else new_job() for i in range(5)]
    )
    assert [j.meta for j in jobs] == [None, {"n": "1"}, None, {"n": "3"}, None]
    assert [(await store.get(j.id)).meta for j in jobs] == [j.meta for j in jobs]


async def test_a_spawned_child_keeps_the_meta_it_is_given(store: Store) -> None:
    parent = await running_job(store)
    child = await store.spawn(parent.id, parent.lease_token, new_job(meta={"a": "b"}))
    assert child is not None and child.meta == {"a": "b"}
    assert (await store.get(child.id)).meta == {"a": "b"}


def _task(app: App) -> Any:
    @app.task(name="labelled")
    async def labelled(ctx: Any, n: int = 0) -> dict[str, str] | None:
        return ctx.job.meta  # type: ignore[no-any-return]

    return labelled


async def test_enqueue_options_meta_reaches_the_handler(app: App) -> None:
    task = _task(app)
    job = await task.options(meta=TRACE).enqueue(n=1)
    assert job.meta == TRACE
    assert (await app.get(job.id)).meta == TRACE
    [done] = await app.run_until_idle()
    assert done.result == TRACE


async def test_enqueue_many_and_workflow_nodes_carry_meta(app: App) -> None:
    task = _task(app)
    many = await app.enqueue_many([(task, {"n": 1}), (task, {"n": 2})], meta={"batch": "7"})
    assert [j.meta for j in many] == [{"batch": "7"}] * 2
    flow = Workflow()
    flow.add("a", task, {"n": 3}, meta={"step": "a"})
    flow.add("b", task, {"n": 4}, depends_on=["a"])
    made = await app.enqueue_workflow(flow)
    assert (await app.get(made["a"].id)).meta == {"step": "a"}
    assert (await app.get(made["b"].id)).meta is None


async def test_empty_meta_is_no_meta(app: App, db_url: str) -> None:
    task = _task(app)
    job = await task.options(meta={}).enqueue()
    assert job.meta is None
    db = Db(db_url)
    try:
        assert _stored_meta(db, job.id) is None
    finally:
        db.close()


def _bad_metas() -> list[Any]:
    return [
        pytest.param(["a", "b"], id="not-a-mapping"),
        pytest.param({f"k{i}": "v" for i in range(33)}, id="33-keys"),
        pytest.param({"": "v"}, id="empty-key"),
        pytest.param({"a b": "v"}, id="space-in-key"),
        pytest.param({"a:b": "v"}, id="colon-in-key"),
        pytest.param({"k" * 65: "v"}, id="key-of-65"),
        pytest.param({1: "v"}, id="int-key"),
        pytest.param({"k": 1}, id="int-value"),
        pytest.param({"k": None}, id="null-value"),
        pytest.param({"k": "v" * 513}, id="value-of-513"),
        pytest.param({"k": "a\x00b"}, id="nul-in-value"),
        pytest.param({f"k{i}": "é" * 300 for i in range(8)}, id="over-4KiB"),
    ]


@pytest.mark.parametrize("meta", _bad_metas())
async def test_bad_meta_is_refused_and_nothing_is_written(app: App, meta: Any) -> None:
    task = _task(app)
    with pytest.raises(InvalidJobError, match="meta"):
        await task.options(meta=meta).enqueue()
    with pytest.raises(InvalidJobError, match="meta"):
        await app.enqueue_many([(task, {}), (task, {})], meta=meta)
    flow = Workflow()
    flow.add("ok", task)
    flow.add("bad", task, meta=meta)
    with pytest.raises(InvalidJobError, match="meta"):
        await app.enqueue_workflow(flow)
    assert await app.jobs.list() == []


async def test_meta_at_the_limits_is_kept(app: App) -> None:
    task = _task(app)
    # 32 keys of 64 characters: 32 * (64 + 6) + 1 bytes of JSON with one-character values.
    wide = {f"{i:02d}" + "k" * 62: "v" for i in range(32)}
    long = {"k": "v" * 512}
    jobs: list[Job] = [await task.options(meta=m).enqueue() for m in (wide, long)]
    assert [(await app.get(j.id)).meta for j in jobs] == [wide, long]


async def test_jobs_are_listed_by_meta(app: App) -> None:
    task = _task(app)
    a = await task.options(meta={"tenant": "t1", "env": "prod"}).enqueue()
    b = await task.options(meta={"tenant": "t1", "env": "dev"}).enqueue()
    await task.options(meta={"tenant": "t2", "env": "prod"}).enqueue()
    dotted = await task.options(meta={"tenant.id": "t1"}).enqueue()
    plain = await task.enqueue()

    async def ids(meta: dict[str, str] | None) -> list[int]:
        return [j.id for j in await app.jobs.list(meta=meta)]

    assert await ids({"tenant": "t1"}) == [b.id, a.id]
    assert await ids({"tenant": "t1", "env": "prod"}) == [a.id]
    assert await ids({"tenant": "t3"}) == []
    assert await ids({"tenant.id": "t1"}) == [dotted.id]  # a dot is not a path step
    assert await ids({"env": "prod", "tenant": "t1"}) == [a.id]
    assert plain.id in await ids(None)
    assert plain.id in await ids({})  # no pairs: no filter
    with pytest.raises(InvalidJobError, match="meta key"):
        await app.jobs.list(meta={'a"b': "x"})
