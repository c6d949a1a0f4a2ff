"""Migration 15 scopes the idempotency keys of jobs that have an owner."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tether.store import Store
from tether.store.base import load_migrations
from tether.store.common import schema as schema_sql

from .support import new_job

SCOPED = 15


@pytest.fixture
def pg_url(pg_fresh_url: str) -> str:
    """This test starts from a schema no migration has touched."""
    return pg_fresh_url


async def test_keys_stored_before_the_scope_are_scoped_by_their_owner(
    make_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database as it was before: every migration but the scoping one (later ones too,
    # since the code that writes the old rows expects their columns).
    monkeypatch.setattr(
        schema_sql,
        "load_migrations",
        lambda d: [m for m in load_migrations(d) if m.version != SCOPED],
    )
    old = make_store()
    await old.open()
    await old.migrate()
    owned, ownerless = await old.enqueue(
        [
            new_job(owner="alice", idempotency_key="nightly"),
            new_job(idempotency_key="nightly-python"),
        ]
    )
    await old.close()
    monkeypatch.undo()
    s = make_store()
    await s.open()
    assert SCOPED in await s.migrate()
    # As the App now stores them: alice's key under her name, an ownerless key as given.
    again_owned, again_ownerless, bobs = await s.enqueue(
        [
            new_job(owner="alice", idempotency_key="alice\x1fnightly"),
            new_job(idempotency_key="nightly-python"),
            new_job(owner="bob", idempotency_key="bob\x1fnightly"),
        ]
    )
    assert again_owned.id == owned.id and again_ownerless.id == ownerless.id
    assert bobs.id not in (owned.id, ownerless.id)
    assert (await s.get(owned.id)).idempotency_key == "nightly"  # type: ignore[union-attr]
