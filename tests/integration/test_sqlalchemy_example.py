"""The SQLAlchemy example in examples/: the order and its job commit or roll back together."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from examples.sqlalchemy_orders import Base, Order, place_order, register
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from tether import App


@pytest.fixture
def app_and_engine(db_url: str) -> Iterator[tuple[App, Session]]:
    app = App(db_url)
    app.run_sync(app.admin.migrate())
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        yield app, session
    Base.metadata.drop_all(engine)
    engine.dispose()
    app.run_sync(app.close())


def test_sqlalchemy_session_commit_keeps_the_order_and_its_job(
    app_and_engine: tuple[App, Session],
) -> None:
    app, session = app_and_engine
    ship = register(app)
    job = place_order(session, ship, 1)
    session.commit()
    [done] = app.run_until_idle_sync()
    assert (done.id, done.state.value, done.result) == (job.id, "succeeded", "shipped 1")
    assert session.scalar(select(func.count()).select_from(Order)) == 1


def test_sqlalchemy_session_rollback_leaves_neither_order_nor_job(
    app_and_engine: tuple[App, Session],
) -> None:
    app, session = app_and_engine
    ship = register(app)
    place_order(session, ship, 1)
    session.rollback()
    assert app.run_until_idle_sync() == []
    assert app.run_sync(app.jobs.list()) == []
    assert session.scalar(select(func.count()).select_from(Order)) == 0
