"""Workflow propagation on SQLite (:mod:`tether.store.sqlite_workflow`); PostgreSQL does
the same in its transition trigger, ``tether_workflow_step``."""

from tether.store.sql.sqlite.fragments import LIVE_SQL, NOW, each

FLAGS = (
    "SELECT id, state, cancel_cascade, has_children, has_dependents, "
    "parent_id IS NOT NULL OR waiting_children "
    f"FROM tether_jobs WHERE id IN {each('ids')}"
)
# Orphans: the live children of parents that finished.
CANCEL_ORPHANS = (
    "UPDATE tether_jobs SET state = 'cancelled', "
    f"cancel_requested_at = COALESCE(cancel_requested_at, {NOW}), "
    "cancel_reason = COALESCE(cancel_reason, 'parent job completed'), "
    "lease_token = lease_token + (state = 'running'), "
    f"lease_expires_at = NULL, finished_at = {NOW}, actor = 'tether', "
    "reason = 'parent job completed' "
    f"WHERE parent_id IN {each('ids')} AND state IN ({LIVE_SQL}) RETURNING id"
)
# Everything downstream of the roots (dependents and children, transitively); a running
# one keeps running with a cancel request.
CANCEL_DOWNSTREAM = (
    "WITH RECURSIVE reach(id) AS (SELECT value FROM json_each(:ids) "
    "UNION SELECT d.job_id FROM tether_dependencies d JOIN reach r "
    "ON d.depends_on = r.id "
    "UNION SELECT c.id FROM tether_jobs c JOIN reach r ON c.parent_id = r.id) "
    "UPDATE tether_jobs SET "
    "state = CASE WHEN state = 'running' THEN state ELSE 'cancelled' END, "
    f"cancel_requested_at = COALESCE(cancel_requested_at, {NOW}), "
    "cancel_reason = COALESCE(cancel_reason, "
    "'an upstream job was cancelled or failed'), "
    f"finished_at = CASE WHEN state = 'running' THEN finished_at ELSE {NOW} END, "
    "actor = 'tether', reason = 'an upstream job was cancelled or failed' "
    f"WHERE id IN (SELECT id FROM reach) AND id NOT IN {each('ids')} "
    f"AND state IN ({LIVE_SQL}) RETURNING id, state"
)
QUEUE_UNBLOCKED = (
    f"UPDATE tether_jobs SET state = 'queued', run_at = {NOW}, "
    "actor = 'tether', reason = 'dependencies succeeded' "
    "WHERE state = 'blocked' AND NOT waiting_children AND id IN "
    f"(SELECT job_id FROM tether_dependencies WHERE depends_on IN {each('ids')}) "
    "AND NOT EXISTS (SELECT 1 FROM "
    "tether_dependencies d JOIN tether_jobs up ON up.id = d.depends_on "
    "WHERE d.job_id = tether_jobs.id AND up.state <> 'succeeded') "
    "RETURNING id"
)
RELEASE_PARENTS = (
    "UPDATE tether_jobs SET state = 'queued', waiting_children = 0, "
    f"run_at = {NOW}, actor = 'tether', "
    "reason = 'children finished; phase ' || COALESCE(phase, 'ingest') "
    f"WHERE state = 'blocked' AND waiting_children AND (id IN {each('ids')} OR id IN "
    f"(SELECT parent_id FROM tether_jobs WHERE id IN {each('ids')})) "
    "AND NOT EXISTS (SELECT 1 FROM tether_jobs c "
    f"WHERE c.parent_id = tether_jobs.id AND c.state IN ({LIVE_SQL})) "
    "RETURNING id"
)
