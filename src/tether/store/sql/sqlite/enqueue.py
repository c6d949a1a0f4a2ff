"""Creating jobs: enqueue, spawn and delete (see :mod:`tether.store.common.enqueue`).

Every statement runs under the write lock, so nothing changes between a read and the
write that follows it: no key locks, no row locks. ``:batch`` is the bulk enqueue being
written (see ``SqliteStore._enqueue_in_chunks``), or NULL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tether.store.rows import CANCELLABLE_SQL, JOB_COLUMNS
from tether.store.sql.sqlite.fragments import LIVE_SQL, NOW, each

# A job of another bulk enqueue still in progress (the parameter: this enqueue's own
# batch, or NULL): it may yet be deleted with its bulk.
_UNCOMMITTED = (
    "(batch IS NOT NULL AND batch IS NOT :batch AND batch IN (SELECT id FROM tether_open_batches))"
)

# The write lock serializes enqueues.
LOCK_KEYS = None

# A key whose uniqueness window has passed is let go by its old job.
RELEASE_KEYS = (
    "UPDATE tether_jobs SET idempotency_key = NULL "
    f"WHERE idempotency_key IN {each('keys')} AND idempotency_expires_at <= {NOW}"
)

# The jobs that hold the keys, with the key as stored; a pending one may yet be deleted
# with its bulk: no answer to give now.
TAKEN_KEYS = (
    f"SELECT idempotency_key, {_UNCOMMITTED} AS pending, {JOB_COLUMNS} FROM tether_jobs "
    f"WHERE idempotency_key IN {each('keys')}"
)

# Ids for the new jobs, drawn before anything is written, so that the dependencies on
# earlier entries of the batch are known first: the next ones AUTOINCREMENT would give
# (no other writer can take them before our insert, which moves sqlite_sequence on).
NEW_IDS = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :n) "
    "SELECT i + max(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'tether_jobs'), 0), "
    "COALESCE((SELECT MAX(id) FROM tether_jobs), 0)) FROM n"
)

# A job of another bulk still being written is not there yet: depending on it would
# leave a dangling link if that bulk failed.
DEPENDENCY_STATES = (
    f"SELECT id, state FROM tether_jobs WHERE id IN {each('ids')} AND NOT {_UNCOMMITTED}"
)


def _at(i: int) -> str:
    return f"json_extract(value, '$[{i}]')"


# Every enqueue (every chunk of a bulk), one statement: the rows come as one JSON array
# of arrays (see job_rows), as fast as a statement per row and a single step.
INSERT_JOBS = (
    "INSERT INTO tether_jobs (id, task, args, queue, priority, key, state, max_attempts, "
    "timeout, run_at, created_at, owner, idempotency_key, actor, budget, limits, parent_id, "
    "has_dependents, batch, idempotency_expires_at, meta) "
    f"SELECT {', '.join(_at(i) for i in range(9))}, COALESCE({_at(16)}, {NOW} + {_at(9)}), "
    f"{NOW}, {_at(10)}, {_at(11)}, 'enqueue', {_at(12)}, {_at(13)}, {_at(14)}, {_at(15)}, "
    f":batch, {NOW} + {_at(17)}, {_at(18)} FROM json_each(:rows) ORDER BY key "
    f"RETURNING idempotency_key, {JOB_COLUMNS}"
)
# SQLite's insert has no conflict clause to leave out (the key's lookup comes first).
INSERT_KEYLESS_JOBS = None


def job_rows(rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """:data:`INSERT_JOBS`'s parameters (rows of
    :meth:`~tether.store.common.enqueue.EnqueueSql._job_row`): times in Unix seconds."""
    out = []
    for row in rows:
        row = list(row)
        row[16] = None if row[16] is None else row[16].timestamp()
        out.append(row)
    return {"rows": out}


INSERT_DEPENDENCIES = (
    "INSERT INTO tether_dependencies (job_id, depends_on) "
    "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:pairs)"
)


def dependency_rows(pairs: Sequence[tuple[int, int]], outside: Sequence[int]) -> dict[str, Any]:
    """:data:`INSERT_DEPENDENCIES`'s parameters, from (job, the job it depends on);
    ``outside``, the upstream jobs not of this enqueue, matters only to PostgreSQL."""
    return {"pairs": list(pairs)}


MARK_UPSTREAM = f"UPDATE tether_jobs SET has_dependents = 1 WHERE id IN {each('ids')}"

# Fenced by the parent's lease: a cancelled, deleted or rescued parent cannot spawn.
SPAWN = (
    "INSERT INTO tether_jobs (task, args, queue, priority, key, state, max_attempts, "
    "timeout, run_at, created_at, owner, idempotency_key, actor, budget, limits, "
    "parent_id, meta) SELECT :task, :args, :queue, :priority, :key, 'queued', :max_attempts, "
    f":timeout, {NOW} + :delay, {NOW}, p.owner, :idem, 'spawn', :budget, :limits, p.id, "
    ":meta "
    "FROM tether_jobs p WHERE p.id = :parent AND p.lease_token = :token "
    "AND p.state = 'running' AND p.cancel_requested_at IS NULL "
    f"RETURNING {JOB_COLUMNS}"
)

MARK_PARENT = "UPDATE tether_jobs SET has_children = 1 WHERE id = :id"

DELETING = f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id = :id"

CANCEL_CHILDREN = (
    "UPDATE tether_jobs SET state = 'cancelled', "
    f"cancel_requested_at = COALESCE(cancel_requested_at, {NOW}), "
    "cancel_reason = COALESCE(cancel_reason, 'parent job deleted'), "
    "lease_token = lease_token + (state = 'running'), lease_expires_at = NULL, "
    f"finished_at = {NOW}, actor = :actor, reason = 'parent job deleted' "
    f"WHERE parent_id = :id AND state IN ({LIVE_SQL}) RETURNING {JOB_COLUMNS}"
)

SETTLE_DELETED = (
    "UPDATE tether_jobs SET state = 'cancelled', "
    f"cancel_requested_at = COALESCE(cancel_requested_at, {NOW}), "
    "cancel_reason = COALESCE(cancel_reason, 'job deleted'), "
    "lease_token = lease_token + (state = 'running'), lease_expires_at = NULL, "
    f"finished_at = {NOW}, actor = :actor, reason = 'job deleted' "
    f"WHERE id = :id AND state IN ({CANCELLABLE_SQL})",
)

DELETE_JOB = (
    "DELETE FROM tether_dependencies WHERE job_id = :id",
    "DELETE FROM tether_artifacts WHERE job_id = :id",
    "DELETE FROM tether_steps WHERE job_id = :id",
    "DELETE FROM tether_signals WHERE job_id = :id",
    "DELETE FROM tether_job_logs WHERE job_id = :id",
    "DELETE FROM tether_jobs WHERE id = :id",
)
