"""The storage boundary, split by concern: one small protocol per thing a store keeps.

Code outside :mod:`tether.store` asks for the narrowest of these it needs, so a reader
sees what each part may touch; :class:`~tether.store.base.Store` is all of them at once,
and both stores implement it.

=====================  ============================================================
``SchemaStore``        the store's lifecycle and its schema's migrations
``ListenStore``        hints, and listening for other processes' commits (part of
                       ``JobStore`` and ``FeedStore``: their callers wait for changes)
``JobStore``           jobs and workflows: enqueue, read, steer, follow their links
``LeaseStore``         what workers claim, extend and write under a lease token
``QueueStore``         queue pause flags, concurrency keys, resource pools, rate limits
``CancellationStore``  cancellation records
``AuthStore``          API tokens and the audit log
``FeedStore``          the live feed of job transitions
``WorkerStore``        the worker registry
``MaintenanceStore``   rescue, the maintenance leader's lease, retention
``ScheduleStore``      periodic schedules and the clock they go by
``StepStore``          durable steps, sleeps, waits and the signals sent to jobs
``JobLogStore``        the lines a job's handler logged
=====================  ============================================================
"""

from __future__ import annotations

from tether.store.protocols.auth import AuthStore
from tether.store.protocols.cancellations import CancellationStore
from tether.store.protocols.feed import FeedStore
from tether.store.protocols.jobs import JobStore
from tether.store.protocols.leases import LeaseStore
from tether.store.protocols.listen import ListenStore
from tether.store.protocols.logs import JobLogStore
from tether.store.protocols.maintenance import MaintenanceStore, ProcessGone
from tether.store.protocols.queues import QueueStore
from tether.store.protocols.schedules import ScheduleStore
from tether.store.protocols.schema import SchemaStore
from tether.store.protocols.steps import StepStore
from tether.store.protocols.workers import WorkerStore

__all__ = [
    "AuthStore",
    "CancellationStore",
    "FeedStore",
    "JobLogStore",
    "JobStore",
    "LeaseStore",
    "ListenStore",
    "MaintenanceStore",
    "ProcessGone",
    "QueueStore",
    "ScheduleStore",
    "SchemaStore",
    "StepStore",
    "WorkerStore",
]
