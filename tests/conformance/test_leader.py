"""The maintenance leader's lease: one holder at a time, taken over once it runs out."""

from __future__ import annotations

from tether.maintenance import LeaderElection
from tether.ops import MAINTENANCE
from tether.store import Store

from .support import Db


def run_out(db: Db) -> None:
    """Make the lease look expired, as it is once its holder stopped renewing."""
    if db.dialect == "sqlite":
        expr = "((julianday('now') - 2440587.5) * 86400.0) - 1"
    else:
        expr = "now() - interval '1 second'"
    db.execute(f"UPDATE tether_leaders SET expires_at = {expr} WHERE name = %s", (MAINTENANCE,))


async def test_one_holder_leads_until_its_lease_runs_out(store: Store, db: Db) -> None:
    assert await store.get_leader(MAINTENANCE) is None
    first = await store.lead(MAINTENANCE, "w1", 30)
    assert (first.holder, first.active) == ("w1", True)
    assert (await store.lead(MAINTENANCE, "w2", 30)).holder == "w1"
    renewed = await store.lead(MAINTENANCE, "w1", 30)
    assert renewed.since == first.since and renewed.expires_at >= first.expires_at
    run_out(db)
    stale = await store.get_leader(MAINTENANCE)
    assert stale is not None and (stale.holder, stale.active) == ("w1", False)
    taken = await store.lead(MAINTENANCE, "w2", 30)
    assert (taken.holder, taken.active) == ("w2", True) and taken.since > first.since
    # The old holder, back from a freeze, cannot renew what it lost.
    assert (await store.lead(MAINTENANCE, "w1", 30)).holder == "w2"


async def test_resigning_hands_the_lease_over_at_once(store: Store) -> None:
    await store.lead(MAINTENANCE, "w1", 30)
    await store.resign(MAINTENANCE, "w2")  # not the holder: changes nothing
    assert (await store.lead(MAINTENANCE, "w2", 30)).holder == "w1"
    await store.resign(MAINTENANCE, "w1")
    assert (await store.lead(MAINTENANCE, "w2", 30)).holder == "w2"


async def test_a_new_leader_takes_over_when_the_old_one_stops_renewing(
    store: Store, db: Db
) -> None:
    old = LeaderElection(store, "w1", ttl=30, interval=1)
    new = LeaderElection(store, "w2", ttl=30, interval=1)
    assert await old.run_once() and old.leading
    assert not await new.run_once() and not new.leading
    # The old leader is killed: it renews no more, and its lease runs out.
    run_out(db)
    assert await new.run_once() and new.leading
    # Had it only been frozen, it learns at its next round that it lost.
    assert not await old.run_once() and not old.leading
    assert old.current is not None and old.current.holder == "w2"
