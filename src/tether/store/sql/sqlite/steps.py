"""Durable steps, sleeps and signals (see :mod:`tether.store.common.steps`)."""

from tether.store.sql.sqlite.fragments import NOW

STEPS = (
    "SELECT job_id, name, kind, state, result, attempt, started_at, finished_at, wakes_at, "
    # rowid: the order the rows were made in (PostgreSQL's seq).
    "usage FROM tether_steps WHERE job_id = :id ORDER BY rowid"
)
STEP = (
    "SELECT job_id, name, kind, state, result, attempt, started_at, finished_at, wakes_at, "
    f"usage, wakes_at - {NOW} AS left_s FROM tether_steps WHERE job_id = :id AND name = :name"
)

# See the PostgreSQL text; the write lock serializes it with every other write.
SAVE_STEP = (
    "INSERT INTO tether_steps (job_id, name, kind, state, result, attempt, started_at, "
    "finished_at, wakes_at, usage) "
    f"SELECT :id, :name, :kind, :state, :result, attempt, {NOW} - :took, "
    f"CASE WHEN :state = 'waiting' THEN NULL ELSE {NOW} END, "
    f"CASE WHEN :wait IS NULL THEN NULL ELSE {NOW} + :wait END, :usage "
    "FROM tether_jobs WHERE id = :id AND lease_token = :token AND state = 'running' "
    "ON CONFLICT (job_id, name) DO UPDATE SET state = excluded.state, "
    "result = excluded.result, attempt = excluded.attempt, "
    "finished_at = excluded.finished_at, usage = tether_steps.usage + excluded.usage "
    "WHERE tether_steps.state <> 'done'"
)

# No row locks: the write lock the transaction holds lets nothing change meanwhile.
LOCK_OWN_JOB = (
    "SELECT 1 FROM tether_jobs WHERE id = :id AND lease_token = :token AND state = 'running'"
)
LOCK_JOB = "SELECT state FROM tether_jobs WHERE id = :id"

SIGNAL = "SELECT payload FROM tether_signals WHERE job_id = :id AND name = :name"
SEND_SIGNAL = (
    "INSERT INTO tether_signals (job_id, name, payload, sent_at, sent_by) "
    f"VALUES (:id, :name, :payload, {NOW}, :actor) ON CONFLICT (job_id, name) DO NOTHING"
)
# The text compared here; texts that differ are compared as JSON values by the shared
# code (tether.store.common.steps.same_json), as PostgreSQL's jsonb compares them.
SAME_SIGNAL = (
    "SELECT payload IS :payload AS same, payload AS stored FROM tether_signals "
    "WHERE job_id = :id AND name = :name"
)
WAKE = (
    f"UPDATE tether_jobs SET run_at = MIN(run_at, {NOW}) "
    "WHERE id = :id AND state IN ('queued', 'retrying', 'paused') "
    "AND EXISTS (SELECT 1 FROM tether_steps s WHERE s.job_id = :id AND s.name = :step "
    "AND s.state = 'waiting') RETURNING queue"
)

# The caller's transaction holds the write lock (BEGIN IMMEDIATE): nothing changes
# between this look and its commit.
FENCE = "SELECT 1 FROM tether_jobs WHERE id = :id AND lease_token = :token AND state = 'running'"

# No function to call: SAVE_STEP and FENCE in one transaction, which the store's thread
# runs in one hop anyway.
SAVE_STEP_AT_ONCE = None
