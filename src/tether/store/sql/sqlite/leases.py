"""Claims, heartbeats, checkpoints, outcomes and artifacts (see
:mod:`tether.store.common.leases`)."""

import functools
import json
from collections.abc import Sequence

from tether.job import Beat, Outcome
from tether.store.rows import JOB_COLUMNS, effective_state
from tether.store.sql.sqlite.fragments import NOW, RATE_TOKENS, TERMINAL_SQL, each

# The claim (SqliteStore._claim): a look before the write lock, then, under it, the
# candidates, the limits' room and the buckets' tokens, which tether.store.admission
# walks in Python (PostgreSQL does the same inside tether_claim_paced: see there why
# there are two), then the spending and the claim itself.


def claim_names(queues: Sequence[str], tasks: Sequence[str]) -> dict[str, str]:
    """The parameters of :func:`claim_ready` and :func:`claim_candidates`: one per queue
    (``queue0``, ...) and per task (``task0``, ...)."""
    named = {f"queue{i}": name for i, name in enumerate(queues)}
    named.update((f"task{i}", name) for i, name in enumerate(tasks))
    return named


def _pick(queues: int, tasks: int) -> str:
    # One placeholder per name, not json_each: a list of one is an equality, which lets
    # the planner walk tether_jobs_claimable in claim order and stop at the LIMIT, where
    # a subquery has it sort every queued job.
    in_queues = ", ".join(f":queue{i}" for i in range(queues))
    in_tasks = ", ".join(f":task{i}" for i in range(tasks))
    return (
        "FROM tether_jobs WHERE state IN ('queued', 'retrying') "
        f"AND queue IN ({in_queues}) AND task IN ({in_tasks}) AND run_at <= {NOW} "
        # A bulk enqueue still under way: its jobs wait for its last chunk.
        "AND (batch IS NULL OR batch NOT IN (SELECT id FROM tether_open_batches))"
    )


@functools.cache  # a worker asks with the same counts at every poll
def claim_ready(queues: int, tasks: int) -> str:
    """Whether any job of these many queues and tasks is claimable (one row or none)."""
    return f"SELECT 1 {_pick(queues, tasks)} LIMIT 1"


@functools.cache
def claim_candidates(queues: int, tasks: int) -> str:
    """The claimable jobs of these many queues and tasks, in claim order, that no full
    limit, held limit or empty rate bucket rules out: twice the ``limit`` wanted, so
    that some passed over by the limits leave others to take."""
    return (
        f"SELECT id, limits, queue, task {_pick(queues, tasks)} "
        "AND queue NOT IN (SELECT name FROM tether_queues WHERE paused) "
        "AND (limits IS NULL OR NOT EXISTS (SELECT 1 FROM json_each(tether_jobs.limits) "
        "AS je JOIN tether_limits l ON l.name = je.value WHERE l.used >= l.capacity "
        "OR (l.held > 0 AND l.block_on_hold))) "
        "AND NOT EXISTS (SELECT 1 FROM tether_rate_limits r "
        "WHERE r.id IN ('queue:' || tether_jobs.queue, 'task:' || tether_jobs.task) "
        f"AND {RATE_TOKENS} < 1) "
        "ORDER BY priority DESC, run_at, id LIMIT :limit * 2"
    )


# Rate limits: the tokens each bucket holds now; a claim spends one per job.
RATE_BUCKETS = f"SELECT id, {RATE_TOKENS} FROM tether_rate_limits"
LIMIT_ROOM = f"SELECT name, capacity - used FROM tether_limits WHERE name IN {each('names')}"
# A bucket's clock never moves back: a process whose clock is behind the last refill's
# (each SQLite process reads its own) counted no refill, and leaves refilled_at alone.
SPEND_TOKENS = (
    "UPDATE tether_rate_limits SET tokens = max(0.0, :tokens - :spent), "
    f"refilled_at = max(refilled_at, {NOW}) WHERE id = :id"
)
CLAIM_TAKE = (
    "UPDATE tether_jobs SET state = 'running', attempt = attempt + 1, "
    "worker_id = :worker, lease_token = lease_token + 1, "
    f"lease_expires_at = {NOW} + :lease, heartbeat_at = {NOW}, started_at = {NOW}, "
    "result = NULL, stopped_by = NULL, actor = 'worker', reason = NULL "
    f"WHERE id IN {each('ids')} RETURNING {JOB_COLUMNS}"
)


def beats(part: Sequence[Beat]) -> str:
    """HEARTBEAT's ``beats`` parameter: arrays, cheaper to write than objects."""
    return json.dumps(
        [(b.job_id, b.lease_token, b.progress_current, b.progress_total, b.usage) for b in part]
    )


# One statement for every beat, as FINISH; the worker's row is HEARTBEAT_WORKER's. The
# unary + keeps the planner off the state index: each beat is one primary-key lookup.
HEARTBEAT = (
    f"UPDATE tether_jobs SET lease_expires_at = {NOW} + :lease, heartbeat_at = {NOW}, "
    "progress_current = COALESCE(v.cur, progress_current), "
    "progress_total = COALESCE(v.tot, progress_total), "
    "usage = COALESCE(v.us, usage) "
    "FROM (SELECT value ->> 0 AS id, value ->> 1 AS tok, value ->> 2 AS cur, "
    "value ->> 3 AS tot, value ->> 4 AS us FROM json_each(:beats)) AS v "
    "WHERE tether_jobs.id = v.id AND tether_jobs.lease_token = v.tok "
    "AND +tether_jobs.state = 'running' "
    "RETURNING 'kept', tether_jobs.id, cancel_requested_at IS NOT NULL AS cancel, "
    "cancel_force, pause_requested_at IS NOT NULL AS pause"
)
# No row locks on SQLite: a beat that gets the write lock reaches every row, and one
# that does not fails whole (busy_timeout), as a lost connection does on PostgreSQL.
HEARTBEAT_WORKER = (
    # A worker presumed dead that still beats is alive (see the PostgreSQL HEARTBEAT).
    # Every beat adds one to the counter the rescuers watch.
    f"UPDATE tether_workers SET heartbeat_at = {NOW}, beat_before = heartbeat_at, "
    "beats = beats + 1, lease = :lease, "
    "holding = :holding, beat_seq = COALESCE(:seq, beat_seq), "
    "state = CASE WHEN state = 'dead' THEN 'active' ELSE state END WHERE id = :worker "
    # An older beat delivered late leaves the row to the newer one's (see 0023).
    "AND (:seq IS NULL OR beat_seq < :seq)"
)
WORKER_EXISTS = "SELECT 1 FROM tether_workers WHERE id = :worker"

SAVE_CHECKPOINT = (
    "UPDATE tether_jobs SET checkpoint = :checkpoint "
    "WHERE id = :id AND lease_token = :token AND state = 'running'"
)

# The whole finish is one statement: no NOTIFY payload to keep small here.
FINISH_BATCH = None


def outcomes(part: Sequence[Outcome]) -> str:
    """FINISH's ``outcomes`` parameter: arrays, cheaper to write than objects."""
    return json.dumps(
        [
            (
                o.job_id,
                o.lease_token,
                o.state.value,
                o.result_json,
                o.error,
                o.delay,
                o.reason,
                o.usage,
                o.stopped_by,
                o.phase,
                o.progress_current,
                o.progress_total,
            )
            for o in part
        ]
    )


_STATE = effective_state("v.st", "COALESCE(v.us, usage)")
# One statement for the whole batch: the outcomes come as one JSON array.
FINISH = (
    f"UPDATE tether_jobs SET state = {_STATE}, "
    "result = v.res, "
    "error = CASE WHEN v.st = 'succeeded' THEN NULL ELSE COALESCE(v.err, error) END, "
    # A release or a pause does not spend the attempt.
    "attempt = CASE WHEN v.st IN ('queued', 'paused', 'blocked') THEN attempt - 1 "
    "ELSE attempt END, "
    f"phase = CASE WHEN {_STATE} = 'blocked' THEN v.ph ELSE phase END, "
    f"waiting_children = {_STATE} = 'blocked', "
    # A sleep or a wait for a signal is a release with a delay.
    "run_at = CASE WHEN v.st = 'retrying' OR (v.st = 'queued' AND v.dl > 0) "
    f"THEN {NOW} + v.dl "
    "WHEN v.st = 'queued' AND checkpoint IS NOT NULL THEN MIN(run_at, created_at) "
    "ELSE run_at END, "
    f"finished_at = CASE WHEN {_STATE} IN ({TERMINAL_SQL}) THEN {NOW} ELSE NULL END, "
    "lease_expires_at = NULL, actor = :worker, usage = COALESCE(v.us, usage), "
    "progress_current = COALESCE(v.cur, progress_current), "
    "progress_total = COALESCE(v.tot, progress_total), "
    "stopped_by = v.sb, "
    f"pause_requested_at = CASE WHEN {_STATE} IN ('paused', 'blocked') "
    "THEN pause_requested_at END, "
    f"pause_reason = CASE WHEN {_STATE} = 'paused' THEN COALESCE(pause_reason, v.rs) "
    "ELSE pause_reason END, "
    f"reason = CASE WHEN {_STATE} = 'cancelled' "
    "THEN COALESCE(cancel_reason, v.rs, 'cancel requested') "
    f"WHEN {_STATE} = 'paused' THEN COALESCE(pause_reason, v.rs) ELSE v.rs END "
    "FROM (SELECT value ->> 0 AS id, value ->> 1 AS tok, value ->> 2 AS st, "
    "value ->> 3 AS res, value ->> 4 AS err, value ->> 5 AS dl, value ->> 6 AS rs, "
    "value ->> 7 AS us, value ->> 8 AS sb, value ->> 9 AS ph, value ->> 10 AS cur, "
    "value ->> 11 AS tot FROM json_each(:outcomes)) AS v "
    # The unary + keeps the planner off the state index: each outcome is one
    # primary-key lookup, however many jobs run.
    "WHERE tether_jobs.id = v.id AND tether_jobs.lease_token = v.tok "
    "AND +tether_jobs.state = 'running' RETURNING tether_jobs.id, 1"
)

SAVE_ARTIFACT = (
    "INSERT INTO tether_artifacts (job_id, name, size, data, created_at) "
    f"SELECT :id, :name, :size, :data, {NOW} WHERE EXISTS (SELECT 1 FROM tether_jobs "
    "WHERE id = :id AND lease_token = :token AND state = 'running') "
    "ON CONFLICT (job_id, name) DO UPDATE SET size = excluded.size, "
    "data = excluded.data, created_at = excluded.created_at"
)
# No fence after the INSERT: the write lock serializes writers, so the INSERT's own
# lease test cannot be overtaken by a rescue (see the PostgreSQL LEASE_HELD).
LEASE_HELD = None

LIST_ARTIFACTS = (
    "SELECT job_id, name, size, created_at FROM tether_artifacts WHERE job_id = :id ORDER BY name"
)
GET_ARTIFACT = "SELECT data FROM tether_artifacts WHERE job_id = :id AND name = :name"
