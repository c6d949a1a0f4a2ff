"""Which jobs no live worker can run, and why.

Workers record the queues they claim from and the tasks they know. A waiting job whose
queue and task no live worker serves would wait forever without a word; this module
names those jobs so that the CLI, the API, the dashboard and the metrics can say so.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tether.job import Unserved, WorkerInfo

__all__ = ["STALE_AFTER", "Unserved", "live", "reason", "serves"]

# A worker row still marked active whose heartbeat is older than this is presumed gone
# (it was killed and no other worker has marked it dead yet). Generous, because it is
# compared with this machine's clock rather than the database's.
STALE_AFTER = timedelta(seconds=60)


def live(workers: list[WorkerInfo], now: datetime | None = None) -> list[WorkerInfo]:
    """The workers that claim jobs now: active, with a recent heartbeat."""
    now = now or datetime.now(UTC)
    return [w for w in workers if w.state == "active" and now - w.heartbeat_at < STALE_AFTER]


def serves(worker: WorkerInfo, queue: str, task: str) -> bool:
    """Whether ``worker`` claims jobs of ``task`` on ``queue``."""
    return queue in worker.queues and (worker.tasks is None or task in worker.tasks)


def reason(queue: str, task: str, workers: list[WorkerInfo]) -> str | None:
    """Why no worker in ``workers`` (the live ones) can run ``task`` on ``queue``, or
    ``None`` when one can."""
    if any(serves(w, queue, task) for w in workers):
        return None
    text = f"no worker serves task {task} on queue {queue}"
    if not workers:
        return text + " (no worker is running)"
    if not any(queue in w.queues for w in workers):
        return text + " (no worker listens on this queue)"
    if task.startswith("__main__."):
        return text + (
            " (the task was registered in a script run as __main__; workers know it "
            "by its module name)"
        )
    return text + " (the workers on this queue do not know this task)"
