"""Queues, concurrency limits and rate limits (see :mod:`tether.store.common.queues`)."""

SET_QUEUE_PAUSED = (
    "INSERT INTO tether_queues (name, paused, reason) VALUES (%(name)s, %(paused)s, %(reason)s) "
    "ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, "
    "reason = excluded.reason, changed_at = now()"
)
QUEUE_COUNTS = "SELECT queue, state, COUNT(*) AS n FROM tether_jobs GROUP BY 1, 2"
QUEUE_FLAGS = "SELECT name, paused, reason FROM tether_queues"
# The backlog per queue, for autoscalers polling often: each reads only its partial index
# (tether_jobs_claimable holds queue and run_at, an index-only scan; tether_jobs_running
# the small running set), never the finished jobs, so it stays cheap at millions of rows.
QUEUE_WAITING = (
    "SELECT queue, COUNT(*) AS n, COUNT(*) FILTER (WHERE run_at <= now()) AS due "
    "FROM tether_jobs WHERE state IN ('queued', 'retrying') GROUP BY queue"
)
QUEUE_RUNNING = (
    "SELECT queue, COUNT(*) AS n FROM tether_jobs WHERE state = 'running' GROUP BY queue"
)
DEFINE_LIMIT = (
    "INSERT INTO tether_limits (name, kind, capacity, block_on_hold) "
    "VALUES (%(name)s, %(kind)s, %(capacity)s, %(block_on_hold)s) ON CONFLICT (name) DO UPDATE "
    "SET capacity = excluded.capacity, block_on_hold = excluded.block_on_hold"
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
    "INSERT INTO tether_rate_limits (id, per_second, burst, tokens) "
    "VALUES (%(id)s, %(per_second)s, %(burst)s, %(burst)s) ON CONFLICT (id) DO UPDATE SET "
    "per_second = excluded.per_second, burst = excluded.burst, "
    "tokens = excluded.tokens, refilled_at = now()"
)
REMOVE_RATE_LIMIT = "DELETE FROM tether_rate_limits WHERE id = %(id)s"
# A rate limit's bucket as of now: what it held, refilled since, never above the burst.
_RATE_TOKENS = (
    "least(burst, tokens + greatest(0, extract(epoch FROM now() - refilled_at)) * per_second)"
)
# float8: a number of tokens as a float, not the numeric that extract() makes of it.
LIST_RATE_LIMITS = (
    f"SELECT id, per_second, burst, ({_RATE_TOKENS})::float8 AS tokens "
    "FROM tether_rate_limits ORDER BY id"
)
