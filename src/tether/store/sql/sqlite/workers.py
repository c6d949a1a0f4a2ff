"""Worker registrations (see :mod:`tether.store.common.workers`)."""

from tether.store.sql.sqlite.fragments import NOW

# No backend_pid: a worker's liveness on SQLite is its process (and its heartbeats).
REGISTER_WORKER = (
    "INSERT INTO tether_workers (id, name, host, pid, pid_start, boot_id, pid_ns, "
    "machine_id, queues, concurrency, started_at, heartbeat_at, state, tasks, schedules) "
    "VALUES (:id, :name, :host, :pid, :pid_start, :boot_id, :pid_ns, :machine_id, :queues, "
    f":concurrency, {NOW}, {NOW}, 'active', :tasks, :schedules)"
)
SET_WORKER_STATE = f"UPDATE tether_workers SET state = :state, heartbeat_at = {NOW} WHERE id = :id"
SET_WORKER_THREADS = (
    "UPDATE tether_workers SET abandoned_threads = :abandoned, thread_pool_full = :pool_full "
    "WHERE id = :id"
)
LIST_WORKERS = (
    "SELECT w.*, (SELECT COUNT(*) FROM tether_jobs j WHERE j.state = 'running' "
    "AND j.worker_id = w.id) AS running_jobs FROM tether_workers w "
    "ORDER BY w.started_at DESC"
)
