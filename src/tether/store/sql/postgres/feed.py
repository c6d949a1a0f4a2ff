"""The live feed of job events (see :mod:`tether.store.common.feed`)."""

# Events after an id; ``{where}`` is the filter the shared code builds.
FEED = (
    "SELECT e.*, j.queue AS job_queue, j.task AS job_task, j.owner AS job_owner "
    "FROM tether_job_events e LEFT JOIN tether_jobs j ON j.id = e.job_id "
    "WHERE {where} ORDER BY e.id LIMIT %(limit)s"
)
# While this row lasts, the transitions a job's row could give are stored too (the
# triggers of migration 0028 read it), so that the feed, which reads them by id, sees them.
ANNOUNCE_FOLLOWER = (
    "INSERT INTO tether_listeners (channel, until) "
    "VALUES ('tether_feed', now() + make_interval(secs => %(ttl)s)) ON CONFLICT (channel) "
    "DO UPDATE SET until = GREATEST(tether_listeners.until, excluded.until)"
)
LAST_EVENT_ID = "SELECT COALESCE(MAX(id), 0) AS n FROM tether_job_events"
OWNED_CANCELLATIONS = (
    "SELECT c.* FROM tether_cancellations c JOIN tether_jobs j ON j.id = c.job_id "
    "WHERE j.owner = %(owner)s ORDER BY c.initiated_at DESC, c.id "
    "LIMIT %(limit)s OFFSET %(offset)s"
)
