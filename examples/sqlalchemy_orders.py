"""An order and the job that ships it commit together, or not at all (SQLAlchemy).

The job is enqueued on the connection of the SQLAlchemy session, inside the session's
transaction: ``session.commit()`` makes both visible, ``session.rollback()`` leaves
neither. Works the same on SQLite and PostgreSQL (``postgresql+psycopg://``).
"""

from __future__ import annotations

from sqlalchemy import Integer
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import tether


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)


def register(app: tether.App) -> tether.Task:
    """The task that ships an order."""

    @app.task(name="ship_order")
    async def ship_order(ctx: tether.JobContext, order_id: int) -> str:
        return f"shipped {order_id}"

    return ship_order


def place_order(session: Session, ship_order: tether.Task, order_id: int) -> tether.Job:
    """Add the order and enqueue its shipping in the session's transaction; the caller
    commits or rolls back both."""
    session.add(Order(id=order_id))
    session.flush()
    # The DB-API connection under the session: psycopg 3 or sqlite3.
    conn = session.connection().connection.driver_connection
    return ship_order.options(connection=conn).enqueue_sync(order_id=order_id)
