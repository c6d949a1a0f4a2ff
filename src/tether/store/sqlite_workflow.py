"""Workflow propagation on SQLite, inside the transaction of the transitions.

The one rule kept twice on purpose: PostgreSQL applies the same steps in its transition
trigger (``tether_workflow_step``, migrations), where they run inside the transaction of
whatever statement changed a state, with no round trip per step. SQLite has no
procedural triggers of that power, so its store runs them here after each write that
changes states. The differential test (``tests/conformance/test_differential.py``) keeps
the two in agreement.
"""

from __future__ import annotations

from tether import hints as h
from tether.store.driver import Tx
from tether.store.sql.sqlite import workflow as q


async def propagate(tx: Tx, changed: list[int]) -> None:
    """Apply the workflow consequences of the transitions of ``changed``, until nothing
    more changes: orphaned children of finished parents are cancelled (a running one
    with its lease revoked); everything downstream of a failed job, or of one cancelled
    with cascade, is cancelled; dependents whose dependencies all succeeded are queued;
    waiting parents whose children all ended are queued."""
    pending = list(changed)
    while pending:
        ids, pending = pending, []
        await tx.notify(h.CHANGED, [str(i) for i in ids])
        rows = await tx.tuples(q.FLAGS, {"ids": ids})
        # The rows' own flags say which steps have anything to do.
        done = [r[0] for r in rows if r[3] and r[1] in ("succeeded", "failed")]
        roots = [
            r[0]
            for r in rows
            if (r[3] or r[4]) and (r[1] == "failed" or (r[1] == "cancelled" and r[2]))
        ]
        if done:
            pending += [r[0] for r in await tx.tuples(q.CANCEL_ORPHANS, {"ids": done})]
        if roots:
            hit = await tx.tuples(q.CANCEL_DOWNSTREAM, {"ids": roots})
            await tx.notify(h.CONTROL, [str(r[0]) for r in hit if r[1] == "running"])
            pending += [r[0] for r in hit if r[1] != "running"]
        succeeded = [r[0] for r in rows if r[4] and r[1] == "succeeded"]
        if succeeded:
            pending += [r[0] for r in await tx.tuples(q.QUEUE_UNBLOCKED, {"ids": succeeded})]
        released = []
        if any(r[5] for r in rows):
            released = [r[0] for r in await tx.tuples(q.RELEASE_PARENTS, {"ids": ids})]
        pending += released
        if released or succeeded:
            await tx.notify(h.ENQUEUED, [h.ANY])
