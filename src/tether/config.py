"""Frozen settings with named defaults, validated once at construction.

Default timing: a heartbeat every 2 s extends a 10 s lease, and the rescuer looks for
expired leases every second, so a worker that vanishes without trace has its jobs
running again within about 11 s. A worker whose process is gone in the same PID
namespace of the same machine, or whose PostgreSQL session is gone, is noticed faster
than that (see ``WorkerConfig``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from tether.errors import ConfigError

DEFAULT_DATABASE_URL = "sqlite:///tether.db"
DEFAULT_QUEUE = "default"
MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_ARTIFACT_BYTES = 10 * 1024 * 1024
#: What a job's own log keeps (tether.joblog): its first lines, up to both bounds.
JOB_LOG_MAX_LINES = 1000
JOB_LOG_MAX_BYTES = 256 * 1024
DEFAULT_MAX_ATTEMPTS = 3
# Server connections per process: the pool's, plus one LISTEN connection while
# something listens. The pool keeps one connection and grows to its size while calls
# overlap: a busy worker's two claims in flight, a claim beside a completion (a drain at
# the defaults ran 30% faster with 2 than with 1). A connection unused for POOL_MAX_IDLE
# seconds closes again. A worker's pool is narrowed to one connection while the worker is
# idle (no job held, its last claim found none; its loops' calls take turns on it) and
# opens its second as soon as a claim finds jobs (``PostgresStore.worker_idle``): an idle
# worker holds two connections and a busy one three. ``tether serve`` answers concurrent
# requests and takes SERVE_POOL_SIZE.
DEFAULT_POOL_SIZE = 2
POOL_MAX_IDLE = 10.0
SERVE_POOL_SIZE = 4
#: A worker's default slots when every task is async, and when some run in threads or
#: processes (see ``WorkerConfig.slots``).
ASYNC_CONCURRENCY = 100
THREAD_CONCURRENCY = 10


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{name} must be positive, got {value!r}")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter between attempts.

    The delay before attempt ``n + 1`` is ``base_delay * factor ** (n - 1)``, capped at
    ``max_delay``, then spread by up to ``jitter`` (a fraction) either way so that a
    burst of failures does not retry in lockstep.
    """

    base_delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base_delay < 0 or self.max_delay < 0:
            raise ConfigError("retry delays must not be negative")
        if self.factor < 1:
            raise ConfigError("retry factor must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ConfigError("retry jitter must be between 0 and 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        raw = min(self.max_delay, self.base_delay * self.factor ** max(0, attempt - 1))
        spread = raw * self.jitter
        return max(0.0, raw + random.uniform(-spread, spread))


@dataclass(frozen=True)
class LoopBackoff:
    """How a background loop (a :class:`~tether.service.Service`) waits while its rounds
    keep failing, the database being down, say: its usual interval until
    ``after_errors`` rounds in a row have failed, then twice as long after each further
    failure, up to ``ceiling`` seconds. A worker's loops share its
    ``WorkerConfig.backoff``."""

    after_errors: int = 3
    ceiling: float = 30.0

    def __post_init__(self) -> None:
        if self.after_errors < 0:
            raise ConfigError("backoff after_errors must not be negative")
        _positive("backoff ceiling", self.ceiling)

    def delay(self, interval: float, errors: int) -> float:
        """Seconds until the next round of a loop run every ``interval`` seconds, after
        ``errors`` failed rounds in a row."""
        if errors < self.after_errors:
            return interval
        excess = errors - self.after_errors
        return float(min(self.ceiling, interval * 2 ** (excess + 1)))


#: What a loop backs off by unless told otherwise.
DEFAULT_BACKOFF = LoopBackoff()


@dataclass(frozen=True)
class StoreRetry:
    """How a cancellation rides out a transient store fault (a ``StoreError``).

    Each of its store calls is tried up to ``attempts`` times, waiting ``backoff`` between
    tries (by default 0.05 s, 0.2 s, 0.8 s: under 1.1 s in all, so a blip or a failover
    passes while a caller still waits). Once they are spent the record ends ``failed``
    with the error; if even that cannot be written, the follow-up settles it later.
    """

    attempts: int = 4
    backoff: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(base_delay=0.05, factor=4.0, max_delay=2.0, jitter=0.2)
    )

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError("attempts must be at least 1")


@dataclass(frozen=True)
class StoreConfig:
    """How the PostgreSQL store connects (the SQLite store has no pool and ignores it).

    Query parameters of the database URL with the same names win over these, e.g.
    ``postgresql://host/db?pool_size=20&statement_timeout=60``.

    ``pool_size`` ``None`` means the process's default: ``DEFAULT_POOL_SIZE`` (2) for
    workers and producers, ``SERVE_POOL_SIZE`` (4) for ``tether serve``. A process's
    sessions are named ``tether <host>:<pid>`` on the server (``application_name``),
    unless the URL's ``application_name`` (or ``PGAPPNAME``) names them.

    Behind a pooler in transaction mode (PgBouncer), set ``pgbouncer`` (URL:
    ``?pgbouncer=true``): connections then never prepare statements on the server, which
    a pooled server connection shared by many clients would see collide. LISTEN needs a
    session of its own, which such a pooler cannot give: ``listen_url`` (URL:
    ``?listen_url=<percent-encoded URL>``) names a direct connection to the same
    database for it. Without one, a pooled store does not listen and its waits poll.
    ``pgbouncer`` also stops tether from reading the pooled connections' backend pids
    (they name the pooler's server connections, not ours): a dead worker is then found
    by its session on ``listen_url``, else by its stale heartbeat and expired leases.

    Every store call has a deadline. A call that has had no answer for
    ``answer_timeout`` seconds makes the store ask the server, on a fresh connection,
    whether the call's session is still working on it; when the server does not
    answer that either (a partition, a dead host), the call's connection is abandoned
    and the call raises :class:`~tether.errors.StoreError`. So a call during a
    partition fails within about ``answer_timeout + connect_timeout`` seconds, while
    a long bulk write on a healthy server is left to finish, up to the server-side
    ``statement_timeout`` per statement.
    """

    pool_size: int | None = None
    statement_timeout: float = 30.0
    answer_timeout: float = 2.5
    connect_timeout: float = 2.0
    pgbouncer: bool = False
    listen_url: str | None = None

    def __post_init__(self) -> None:
        if self.pool_size is not None and self.pool_size < 1:
            raise ConfigError(f"pool_size must be at least 1, got {self.pool_size!r}")
        _positive("statement_timeout", self.statement_timeout)
        _positive("answer_timeout", self.answer_timeout)
        _positive("connect_timeout", self.connect_timeout)


@dataclass(frozen=True)
class AppConfig:
    """Settings of an :class:`~tether.App`."""

    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    max_artifact_bytes: int = MAX_ARTIFACT_BYTES
    auto_migrate: bool = True
    default_queue: str = DEFAULT_QUEUE
    default_max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # A poll fallback for waits: notifications only shorten it.
    wait_poll_interval: float = 0.5
    retention: RetentionConfig = field(default_factory=lambda: RetentionConfig())
    maintenance: MaintenanceConfig = field(default_factory=lambda: MaintenanceConfig())
    # A cancellation record not settled this long after it began (plus the wait its
    # canceller asked for) lost its canceller: a worker's follow-up, or anyone waiting
    # on it, settles it from the job states.
    cancellation_adopt_after: float = 30.0
    # Retries of a cancellation's store calls before its record ends ``failed``.
    cancellation_retry: StoreRetry = field(default_factory=StoreRetry)
    store: StoreConfig = field(default_factory=StoreConfig)
    # A job's own log (ctx.log): the first lines kept, up to both bounds; later lines
    # are counted, not kept.
    job_log_max_lines: int = JOB_LOG_MAX_LINES
    job_log_max_bytes: int = JOB_LOG_MAX_BYTES

    def __post_init__(self) -> None:
        _positive("max_payload_bytes", self.max_payload_bytes)
        _positive("max_artifact_bytes", self.max_artifact_bytes)
        _positive("job_log_max_lines", self.job_log_max_lines)
        _positive("job_log_max_bytes", self.job_log_max_bytes)
        _positive("wait_poll_interval", self.wait_poll_interval)
        if self.cancellation_adopt_after < 0:
            raise ConfigError("cancellation_adopt_after must not be negative")
        if self.default_max_attempts < 1:
            raise ConfigError("default_max_attempts must be at least 1")


@dataclass(frozen=True)
class WorkerConfig:
    """Settings of a :class:`~tether.Worker`.

    ``lease_duration`` must cover several heartbeats, so one slow write never costs a
    lease. A worker that has not heartbeated successfully for
    ``lease_duration - self_fence_margin`` stops its own jobs: by then another worker may
    be about to take them.
    """

    # Handlers at once. None: ASYNC_CONCURRENCY when every task of the app is async,
    # else THREAD_CONCURRENCY (see ``slots``).
    concurrency: int | None = None
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    claim_batch: int = 50
    poll_interval: float = 1.0
    heartbeat_interval: float = 2.0
    lease_duration: float = 10.0
    self_fence_margin: float = 2.0
    rescue_interval: float = 1.0
    # A worker whose database session is gone is presumed dead only once its heartbeat
    # is also this old, so a short reconnect (a database restart) costs no jobs; and
    # never sooner than it stops its own jobs (see ``session_dead_after``).
    dead_session_grace: float = 6.0
    stop_timeout: float = 30.0
    # Async handlers: from ``ctx.cancelled`` until the task gets CancelledError.
    cancel_grace: float = 2.0
    # A job that still runs this long after its cancel request is abandoned: its lease
    # is revoked so nothing it writes afterwards counts.
    cancel_timeout: float = 10.0
    # Process handlers: from SIGTERM until SIGKILL.
    kill_timeout: float = 5.0
    # Thread handlers that ignore being stopped are abandoned, but their threads run on
    # and hold the worker's thread pool (concurrency + 4 threads); while it is full the
    # worker claims no thread jobs. With a limit, the worker stops gracefully once more
    # than this many abandoned threads still run (exit code 75), for its supervisor to
    # start a fresh one. None: no limit.
    max_abandoned_threads: int | None = None
    # A claimed job whose handler has not started within this many seconds (its thread
    # pool is busy) goes back to the queue unstarted, without spending an attempt.
    handler_start_timeout: float = 10.0
    # While the database keeps failing, the worker's loops (claiming, rescue, the other
    # maintenance services) back off exponentially by this.
    backoff: LoopBackoff = DEFAULT_BACKOFF
    # Gradual start (off by default: 0). When on, the first job starts at once, jobs 2
    # to ramp_warm_jobs one per ramp_warm_interval, and the remaining slots open evenly
    # over ramp_window seconds.
    ramp_window: float = 0.0
    ramp_warm_jobs: int = 10
    ramp_warm_interval: float = 1.0
    name: str | None = None

    def slots(self, executors: Iterable[str]) -> int:
        """The worker's slots for tasks run by ``executors``: ``concurrency`` if set.

        Unset, an app whose tasks are all async gets ``ASYNC_CONCURRENCY``: an async slot
        costs one coroutine, and its handler mostly awaits I/O, so more slots overlap
        more waits (and a drain of short jobs is paced by the database, not the slots).
        A thread or process slot costs an OS thread (the pool has one per slot) or a
        process, so an app with such tasks gets ``THREAD_CONCURRENCY``.
        """
        if self.concurrency is not None:
            return self.concurrency
        if all(e == "async" for e in executors):
            return ASYNC_CONCURRENCY
        return THREAD_CONCURRENCY

    @property
    def session_dead_after(self) -> float:
        """How stale a heartbeat must be before a worker without a database session is
        presumed dead: ``dead_session_grace``, but never less than
        ``lease_duration - self_fence_margin / 2``. A live worker cut off from the
        database looks the same as a dead one, and runs its jobs until it fences itself
        at ``lease_duration - self_fence_margin``; half the margin is left as slack for
        a timer that fires late on a loaded machine."""
        return max(self.dead_session_grace, self.lease_duration - self.self_fence_margin / 2)

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError("concurrency must be at least 1")
        if self.claim_batch < 1:
            raise ConfigError("claim_batch must be at least 1")
        if not self.queues:
            raise ConfigError("a worker needs at least one queue")
        for name in (
            "poll_interval",
            "heartbeat_interval",
            "lease_duration",
            "rescue_interval",
            "stop_timeout",
            "cancel_timeout",
            "kill_timeout",
            "handler_start_timeout",
        ):
            _positive(name, getattr(self, name))
        if self.ramp_window < 0 or self.ramp_warm_jobs < 1 or self.ramp_warm_interval < 0:
            raise ConfigError("ramp settings must not be negative (ramp_warm_jobs >= 1)")
        if self.max_abandoned_threads is not None and self.max_abandoned_threads < 0:
            raise ConfigError("max_abandoned_threads must not be negative")
        if self.cancel_grace < 0 or self.self_fence_margin < 0:
            raise ConfigError("cancel_grace and self_fence_margin must not be negative")
        if self.lease_duration < 2 * self.heartbeat_interval + self.self_fence_margin:
            raise ConfigError(
                "lease_duration must be at least 2 * heartbeat_interval + self_fence_margin "
                f"({self.lease_duration} < {2 * self.heartbeat_interval + self.self_fence_margin})"
            )


DAY = 86400.0


@dataclass(frozen=True)
class RetentionConfig:
    """How long finished work is kept before the pruner deletes it (seconds; ``None``
    keeps it forever). Ages count from the moment a job finished, in database time.

    - ``succeeded``: 1 day. A success needs no investigation; its result was read by
      whoever waited for it, and success is the bulk of all rows, so it goes first.
    - ``failed`` and ``cancelled``: 7 days. Failures and cancellations are what people
      look into, often after a weekend; a week keeps them through one.
    - ``audit``: 90 days. The audit log answers "who did this" long after the job is
      gone, and compliance reviews are usually quarterly.
    - ``workers``: 7 days for stopped and dead worker rows, as long as the failures
      they may explain.

    A job goes with its events, dependency links, artifacts and cancellation records.
    Jobs in a workflow (parent, children, dependencies) with an active member are kept,
    the whole workflow; so are those with a failed member younger than ``failed`` (a
    person may retry it, and its retry reads the rest: a parent's fan-in over its
    children), which go with it once it ages out. A failed job that holds its
    concurrency key (see ``app.queues.configure_key``) is kept until a person retries or deletes
    it, and keeps its workflow meanwhile. Active jobs are
    never pruned. ``batch_size`` rows go per transaction, ``batch_pause`` seconds apart,
    so claims, heartbeats and the SQLite write lock are never held up for long.
    """

    succeeded: float | None = 1 * DAY
    failed: float | None = 7 * DAY
    cancelled: float | None = 7 * DAY
    audit: float | None = 90 * DAY
    workers: float | None = 7 * DAY
    batch_size: int = 500
    batch_pause: float = 0.05
    # How often the maintenance leader prunes.
    interval: float = 60.0

    def __post_init__(self) -> None:
        for name in ("succeeded", "failed", "cancelled", "audit", "workers"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"retention {name} must not be negative, got {value!r}")
        if self.batch_size < 1:
            raise ConfigError("retention batch_size must be at least 1")
        if self.batch_pause < 0:
            raise ConfigError("retention batch_pause must not be negative")
        _positive("retention interval", self.interval)

    def job_ages(self) -> dict[str, float]:
        """The retention of each final state that is pruned at all."""
        ages = {"succeeded": self.succeeded, "failed": self.failed, "cancelled": self.cancelled}
        return {state: age for state, age in ages.items() if age is not None}


@dataclass(frozen=True)
class MaintenanceConfig:
    """The maintenance leader: one worker at a time rescues, follows up cancellations,
    prunes, fires schedules, and releases pending workflow steps and the blocked jobs a
    missed step left waiting (``release_interval``, ``release_batch``: see
    :mod:`tether.maintenance.releaser`).

    Leadership is a lease row stamped with database time: the leader renews it every
    ``leader_renew_interval`` seconds for ``leader_ttl`` seconds. A leader that dies, is
    partitioned or is frozen (SIGSTOP) stops renewing, and another worker takes over
    within ``leader_ttl + leader_renew_interval`` seconds (4 s by default). A leader that
    cannot renew stops acting once its own monotonic clock says the lease ran out.
    """

    leader_ttl: float = 3.0
    leader_renew_interval: float = 1.0
    # How long a maintenance statement (rescue, follow-up, leader, pruning, schedules,
    # releases) may wait for a row lock another client holds before its round gives up and tries
    # again next round. Their own rows are skipped when held (SKIP LOCKED); this bounds
    # what cannot skip (an upsert, a trigger's cascade).
    lock_wait: float = 1.0
    # How often the leader looks for due schedule ticks.
    schedule_interval: float = 1.0
    # How often the leader looks through a batch of blocked jobs for any that wait on
    # something that has already happened (maintenance/releaser.py), and how many.
    release_interval: float = 5.0
    release_batch: int = 500

    def __post_init__(self) -> None:
        _positive("leader_ttl", self.leader_ttl)
        _positive("leader_renew_interval", self.leader_renew_interval)
        _positive("lock_wait", self.lock_wait)
        _positive("schedule_interval", self.schedule_interval)
        _positive("release_interval", self.release_interval)
        _positive("release_batch", self.release_batch)
        if self.leader_renew_interval >= self.leader_ttl:
            raise ConfigError("leader_renew_interval must be shorter than leader_ttl")


def parse_age(text: str) -> float:
    """Seconds in an age such as ``90s``, ``15m``, ``12h``, ``7d`` or ``2w``."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY, "w": 7 * DAY}
    raw = text.strip().lower()
    unit = units.get(raw[-1:]) if raw else None
    number = raw[:-1] if unit is not None else raw
    try:
        value = float(number) * (unit or 1.0)
    except ValueError:
        raise ConfigError(f"bad age {text!r}: use a number with s, m, h, d or w, e.g. 7d") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"bad age {text!r}: it must be a finite, non-negative duration")
    return value
