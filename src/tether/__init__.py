"""tether: a durable job queue where every running job can be stopped safely.

Every running job holds a lease (worker id, fencing token, expiry). Cancel it, lose its
worker, or stop the worker gracefully, and the job still ends exactly once.
"""

from tether.app import App
from tether.cancellation import (
    CancellationRecord,
    CancellationResult,
    CancellationStep,
    CancellationSummary,
)
from tether.config import (
    AppConfig,
    MaintenanceConfig,
    RetentionConfig,
    RetryPolicy,
    StoreConfig,
    WorkerConfig,
)
from tether.context import CancelSignal, JobContext, SyncJobContext
from tether.durable import step
from tether.errors import (
    Cancelled,
    ConfigError,
    DuplicateStepError,
    EnqueueRefused,
    Fail,
    IllegalTransitionError,
    InvalidJobError,
    JobNotFoundError,
    LeaseLostError,
    PayloadTooLargeError,
    Retry,
    SchemaVersionError,
    SignalConflictError,
    SignalTimeoutError,
    StoreError,
    TetherError,
    UnknownTaskError,
    WaitForChildren,
    WaitTimeoutError,
)
from tether.hooks import Enqueueing, Hook, OutcomeEvent
from tether.job import Job, JobEvent, StepInfo, WorkerInfo
from tether.periodic import Schedule
from tether.states import JobState
from tether.task import Task
from tether.worker import Worker
from tether.workflow import Workflow

__all__ = [
    "App",
    "AppConfig",
    "CancelSignal",
    "CancellationRecord",
    "CancellationResult",
    "CancellationStep",
    "CancellationSummary",
    "Cancelled",
    "ConfigError",
    "DuplicateStepError",
    "EnqueueRefused",
    "Enqueueing",
    "Fail",
    "Hook",
    "IllegalTransitionError",
    "InvalidJobError",
    "Job",
    "JobContext",
    "JobEvent",
    "JobNotFoundError",
    "JobState",
    "LeaseLostError",
    "MaintenanceConfig",
    "OutcomeEvent",
    "PayloadTooLargeError",
    "RetentionConfig",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "SchemaVersionError",
    "SignalConflictError",
    "SignalTimeoutError",
    "StepInfo",
    "StoreConfig",
    "StoreError",
    "SyncJobContext",
    "Task",
    "TetherError",
    "UnknownTaskError",
    "WaitForChildren",
    "WaitTimeoutError",
    "Worker",
    "WorkerConfig",
    "WorkerInfo",
    "Workflow",
    "step",
]
__version__ = "0.1.0"
