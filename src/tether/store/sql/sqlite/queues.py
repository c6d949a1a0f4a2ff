"""Queues, concurrency limits and rate limits (see :mod:`tether.store.common.queues`)."""

from tether.store.sql.sqlite.fragments import NOW, RATE_TOKENS

SET_QUEUE_PAUSED = (
    "INSERT INTO tether_queues (name, paused, reason, changed_at) "
    f"VALUES (:name, :paused, :reason, {NOW}) ON CONFLICT (name) DO UPDATE SET "
    f"paused = excluded.paused, reason = excluded.reason, changed_at = {NOW}"
)
QUEUE_COUNTS = "SELECT queue, state, COUNT(*) AS n FROM tether_jobs GROUP BY 1, 2"
QUEUE_FLAGS = "SELECT name, paused, reason FROM tether_queues"
# The backlog per queue, for autoscalers polling often: each searches the state index
# (tether_jobs_state) for the live rows it counts, never the finished jobs, so it stays
# cheap at millions of rows.
QUEUE_WAITING = (
    f"SELECT queue, COUNT(*) AS n, SUM(run_at <= {NOW}) AS due "
    "FROM tether_jobs WHERE state IN ('queued', 'retrying') GROUP BY queue"
)
QUEUE_RUNNING = (
    "SELECT queue, COUNT(*) AS n FROM tether_jobs WHERE state = 'running' GROUP BY queue"
)
DEFINE_LIMIT = (
    "INSERT INTO tether_limits (name, kind, capacity, block_on_hold) "
    "VALUES (:name, :kind, :capacity, :block_on_hold) ON CONFLICT (name) DO UPDATE SET "
    "capacity = excluded.capacity, block_on_hold = excluded.block_on_hold"
)
LIST_LIMITS = (
    "SELECT l.*, (SELECT COUNT(*) FROM tether_jobs j WHERE j.key IS NOT NULL "
    "AND 'key:' || j.key = l.name AND j.state IN ('queued', 'retrying')) AS queued "
    "FROM tether_limits l ORDER BY l.name"
)
WAITING_BY_TASK = (
    "SELECT queue, task, COUNT(*) AS n FROM tether_jobs "
    "WHERE state IN ('queued', 'retrying') GROUP BY 1, 2"
)
SET_RATE_LIMIT = (
    "INSERT INTO tether_rate_limits (id, per_second, burst, tokens, refilled_at) "
    f"VALUES (:id, :per_second, :burst, :burst, {NOW}) ON CONFLICT (id) DO UPDATE SET "
    "per_second = excluded.per_second, burst = excluded.burst, "
    "tokens = excluded.tokens, refilled_at = excluded.refilled_at"
)
REMOVE_RATE_LIMIT = "DELETE FROM tether_rate_limits WHERE id = :id"
# A rate limit's bucket as of now: what it held, refilled since, never above the burst.
LIST_RATE_LIMITS = (
    f"SELECT id, per_second, burst, {RATE_TOKENS} AS tokens FROM tether_rate_limits ORDER BY id"
)
