"""What one job is before it is stored: each check of an enqueue's input, and the
:class:`~tether.job.NewJob` it builds. Pure (no store, no App), so the App, the worker
(spawned children) and the scheduler (schedule declarations) share it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from tether import job_meta, names, payload
from tether.errors import InvalidJobError, PayloadTooLargeError, UnknownTaskError
from tether.job import JSON, NewJob
from tether.ops import ScheduleDeclaration
from tether.periodic import Schedule
from tether.task import EnqueueOptions, Task


def new_job(
    tasks: Mapping[str, Task],
    task_name: str,
    args: dict[str, JSON] | None,
    opts: EnqueueOptions,
    *,
    max_payload_bytes: int,
) -> NewJob:
    """Check one job's input against its task (one of ``tasks``) and build what the
    store inserts; raises :class:`~tether.errors.UnknownTaskError`,
    :class:`~tether.errors.InvalidJobError` or
    :class:`~tether.errors.PayloadTooLargeError` (nothing is written)."""
    task = tasks.get(task_name)
    if task is None:
        known = ", ".join(sorted(tasks)) or "none"
        raise UnknownTaskError(f"unknown task {task_name!r} (registered: {known})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InvalidJobError(f"args must be a JSON object (a dict), got {type(args).__name__}")
    args = task.arguments.for_storage(args)
    try:
        args_json = payload.encode(args)
    except ValueError as exc:
        raise InvalidJobError(f"args of {task_name!r} cannot be stored: {exc}") from exc
    size = len(args_json.encode())
    if size > max_payload_bytes:
        raise PayloadTooLargeError(
            f"args of {task_name!r} are {size} bytes; the limit is {max_payload_bytes}"
        )
    max_attempts = opts.max_attempts if opts.max_attempts is not None else task.max_attempts
    if max_attempts < 1:
        raise InvalidJobError("max_attempts must be at least 1")
    for kind, named in (("queue", opts.queue), ("key", opts.key)):
        if named is not None:
            names.check(kind, named)
    try:
        idempotency_key = payload.scoped_key(opts.owner, opts.idempotency_key)
    except ValueError as exc:
        raise InvalidJobError(str(exc)) from None
    timeout = opts.timeout if opts.timeout is not None else task.timeout
    if timeout is not None and timeout <= 0:
        raise InvalidJobError("timeout must be positive")
    if opts.delay < 0:
        raise InvalidJobError("delay must not be negative")
    if opts.run_at is not None:
        if opts.delay:
            raise InvalidJobError("give delay or run_at, not both")
        if opts.run_at.tzinfo is None or opts.run_at.utcoffset() is None:
            raise InvalidJobError("run_at must be timezone-aware (for example in UTC)")
    if opts.unique_for is not None:
        if opts.idempotency_key is None:
            raise InvalidJobError("unique_for needs an idempotency_key")
        if opts.unique_for <= 0:
            raise InvalidJobError(f"unique_for must be positive, got {opts.unique_for}")
    if opts.budget is not None and opts.budget <= 0:
        raise InvalidJobError(f"budget must be positive, got {opts.budget}")
    meta = job_meta.check(opts.meta)
    limits = ([f"key:{opts.key}"] if opts.key is not None else []) + [
        f"resource:{r}" for r in task.resources
    ]
    return NewJob(
        task=task_name,
        args_json=args_json,
        queue=opts.queue or task.queue,
        priority=opts.priority if opts.priority is not None else task.priority,
        key=opts.key,
        max_attempts=max_attempts,
        timeout=timeout,
        delay=opts.delay,
        owner=opts.owner,
        idempotency_key=idempotency_key,
        budget=opts.budget,
        limits=tuple(limits),
        depends_on=tuple(opts.depends_on),
        run_at=opts.run_at,
        unique_for=opts.unique_for,
        meta=meta,
    )


def checked_meta(new: NewJob) -> NewJob:
    """``new`` once its ``meta`` (changed by an enqueue hook) is checked again."""
    return dataclasses.replace(new, meta=job_meta.check(new.meta))


def declarations(
    tasks: Mapping[str, Task], schedules: Mapping[str, Schedule], *, max_payload_bytes: int
) -> list[ScheduleDeclaration]:
    """``schedules`` as a worker records them for the maintenance leader: each with the
    job its task makes for a tick, built and checked here, where the task's code is (the
    leader may have none)."""
    out = []
    for name, schedule in schedules.items():
        opts = EnqueueOptions(queue=schedule.queue)
        job = new_job(
            tasks, schedule.task, dict(schedule.args), opts, max_payload_bytes=max_payload_bytes
        )
        stored = schedule.stored(job)
        out.append(
            ScheduleDeclaration(name, schedule.task, schedule.cron, schedule.timezone, stored)
        )
    return out
