"""Worker registrations (see :mod:`tether.store.common.workers`)."""

# backend_pid: the store's LISTEN session, whose end tells that the worker died (see
# PostgresStore._worker_session).
REGISTER_WORKER = (
    "INSERT INTO tether_workers (id, name, host, pid, pid_start, boot_id, pid_ns, "
    "machine_id, backend_pid, queues, concurrency, state, tasks, schedules) "
    "VALUES (%(id)s, %(name)s, %(host)s, %(pid)s, %(pid_start)s, %(boot_id)s, %(pid_ns)s, "
    "%(machine_id)s, %(backend_pid)s, %(queues)s, %(concurrency)s, 'active', %(tasks)s, "
    "%(schedules)s)"
)
SET_WORKER_STATE = (
    "UPDATE tether_workers SET state = %(state)s, heartbeat_at = now() WHERE id = %(id)s"
)
SET_WORKER_THREADS = (
    "UPDATE tether_workers SET abandoned_threads = %(abandoned)s, "
    "thread_pool_full = %(pool_full)s WHERE id = %(id)s"
)
LIST_WORKERS = (
    "SELECT w.*, (SELECT COUNT(*) FROM tether_jobs j WHERE j.state = 'running' "
    "AND j.worker_id = w.id) AS running_jobs FROM tether_workers w "
    "ORDER BY w.started_at DESC"
)
