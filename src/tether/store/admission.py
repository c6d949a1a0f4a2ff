"""Which claim candidates the limits admit: SQLite's claim, in Python.

A claim takes a job only while every concurrency limit it names has room and the rate
buckets of its queue and its task (``queue:<name>``, ``task:<name>``) each hold a token;
taking it uses one unit of each limit and spends one token from each bucket.

Why this rule is written twice, here and in PostgreSQL's ``tether_claim_paced`` (the
PL/pgSQL function of the migrations, which :data:`tether.store.sql.postgres.leases.CLAIM`
calls): on SQLite the write lock serializes claimers, so the claim can read the
candidates and the limits, choose here in Python, and write, with nothing changing in
between. PostgreSQL's claimers run concurrently (SKIP LOCKED), so there admission has to
happen in the database, inside the claim's one round trip, under the rate buckets' row
locks. Both keep the global order (priority, then run_at, then id): a job that does not
fit is passed over, never reordered. A change to one is a change to the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

Candidate = tuple[int, Sequence[str], str, str]
"""A claimable job: its id, the limits it names, its queue and its task."""


def admit(
    candidates: Iterable[Candidate],
    room: Mapping[str, int],
    tokens: Mapping[str, float],
    limit: int,
) -> tuple[list[int], dict[str, int]]:
    """The ids of the first ``limit`` ``candidates`` (taken in the order given) that the
    limits admit, and the tokens spent per rate bucket.

    ``room``: what each concurrency limit has left (capacity minus used); a limit not
    in it has none. ``tokens``: what each rate bucket holds now; a queue or task without
    a bucket is not rate limited. Neither mapping is changed.
    """
    left = dict(room)
    spent: dict[str, int] = {}
    chosen: list[int] = []
    for job_id, needs, queue, task in candidates:
        if len(chosen) >= limit:
            break
        rated = [b for b in (f"queue:{queue}", f"task:{task}") if b in tokens] if tokens else []
        if all(left.get(n, 0) > 0 for n in needs) and all(
            tokens[b] - spent.get(b, 0) >= 1 for b in rated
        ):
            for n in needs:
                left[n] -= 1
            for b in rated:
                spent[b] = spent.get(b, 0) + 1
            chosen.append(job_id)
    return chosen, spent
