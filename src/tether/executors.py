"""How a handler runs: on the event loop (async) or in a worker thread (sync).

Both return an asyncio future. Cancelling it stops an async handler (CancelledError at
its next await) and abandons a thread handler: the thread runs on, but the worker stops
waiting for it and its lease is settled, so nothing it writes later counts.
"""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tether.context import JobContext, SyncJobContext
from tether.task import Task


def start_handler(task: Task, ctx: JobContext, threads: ThreadPoolExecutor) -> asyncio.Future[Any]:
    """Start ``task``'s handler for ``ctx.job`` and return its future."""
    args = ctx.job.args
    if task.executor == "async":
        fut: asyncio.Future[Any] = asyncio.ensure_future(task.fn(ctx, **args))
        return fut
    loop = asyncio.get_running_loop()
    sync_ctx = SyncJobContext(ctx, loop)
    call = contextvars.copy_context().run
    return loop.run_in_executor(threads, lambda: call(task.fn, sync_ctx, **args))
