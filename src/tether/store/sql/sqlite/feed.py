"""The live feed of job events (see :mod:`tether.store.common.feed`)."""

# Events after an id; ``{where}`` is the filter the shared code builds.
FEED = (
    "SELECT e.*, j.queue AS job_queue, j.task AS job_task, j.owner AS job_owner "
    "FROM tether_job_events e LEFT JOIN tether_jobs j ON j.id = e.job_id "
    "WHERE {where} ORDER BY e.id LIMIT :limit"
)
# SQLite stores every transition (migration 0028): a feed need not say it follows.
ANNOUNCE_FOLLOWER = None
LAST_EVENT_ID = "SELECT COALESCE(MAX(id), 0) AS n FROM tether_job_events"
OWNED_CANCELLATIONS = (
    "SELECT c.* FROM tether_cancellations c JOIN tether_jobs j ON j.id = c.job_id "
    "WHERE j.owner = :owner ORDER BY c.initiated_at DESC, c.id LIMIT :limit OFFSET :offset"
)
