"""Handlers for ``executor="process"``: module-level plain functions, so that the spawned
child process can import them by name.

:func:`register` adds them to an App under the names in :data:`NAMES`. Every loop is
bounded, so a child that is never stopped (a failing test) still ends by itself and
never outlives the test run.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from tether import App, Task

LIFETIME = 60.0  # seconds a handler that waits to be stopped runs at most


def ignore_sigterm(ctx: Any) -> str:
    """Ignores SIGTERM and never checks for cancellation: only SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ctx.save_checkpoint({"pid": os.getpid()})
    deadline = time.monotonic() + LIFETIME
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return "survived"


def cooperative(ctx: Any) -> str:
    """Checks for cancellation in its loop, so SIGTERM ends it."""
    ctx.save_checkpoint({"pid": os.getpid()})
    deadline = time.monotonic() + LIFETIME
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        time.sleep(0.01)
    return "never stopped"


def note_reason(ctx: Any) -> str:
    """Waits to be stopped, then checkpoints why it was stopped before raising."""
    ctx.save_checkpoint({"pid": os.getpid()})
    deadline = time.monotonic() + LIFETIME
    while not ctx.cancelled.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    ctx.save_checkpoint({"reason": ctx.cancelled.reason})
    ctx.check_cancelled()
    return "never stopped"


def spend(ctx: Any, per_step: int) -> int:
    """Reports usage every step until it is stopped (its budget pauses it)."""
    deadline = time.monotonic() + LIFETIME
    steps = 0
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        ctx.report_usage(per_step)
        steps += 1
        ctx.save_checkpoint({"steps": steps})
        time.sleep(0.01)
    return steps


def add_with_checkpoint(ctx: Any, a: int, b: int) -> dict[str, Any]:
    """Checkpoints, reports progress, and returns a result."""
    before = ctx.checkpoint
    ctx.save_checkpoint({"partial": a})
    ctx.set_progress(1, 1)
    return {"sum": a + b, "checkpoint_before": before, "checkpoint_after": ctx.checkpoint}


def crash(ctx: Any) -> None:
    """The child process dies without a word (after checkpointing its pid)."""
    ctx.save_checkpoint({"pid": os.getpid()})
    os._exit(3)


def lose_pipe_then_crash(ctx: Any) -> None:
    """The pipe to the worker breaks first, then the child dies: no outcome can be sent."""
    ctx.save_checkpoint({"pid": os.getpid()})
    ctx._conn.close()  # as a library that closes inherited descriptors would
    time.sleep(0.2)
    os._exit(3)


def until_file(ctx: Any, path: str) -> str:
    """Checks for cancellation in its loop until ``path`` exists, then returns; counts
    its rounds in ``path.rounds``."""
    ctx.save_checkpoint({"pid": os.getpid()})
    deadline = time.monotonic() + LIFETIME
    rounds = 0
    while not os.path.exists(path) and time.monotonic() < deadline:
        ctx.check_cancelled()
        rounds += 1
        with open(f"{path}.rounds", "w") as out:
            out.write(str(rounds))
        time.sleep(0.01)
    return "done"


def whoami(ctx: Any) -> dict[str, Any]:
    """What the context says about the job it runs."""
    return {"id": ctx.id, "attempt": getattr(ctx, "attempt", None)}


def wants_steps(ctx: Any) -> str:
    """Asks for a durable step, which process handlers do not get."""
    try:
        ctx.step("s", lambda: 1)
    except Exception as exc:  # the error is the result
        return f"{type(exc).__name__}: {exc}"
    return "ran"


def logs(ctx: Any) -> str:
    """Writes two lines to its job's own log through the pipe."""
    ctx.log(f"from process {os.getpid() != 0}")
    ctx.log("a warning", level="warning")
    return "logged"


NAMES: dict[str, Callable[..., Any]] = {
    "ignore_sigterm": ignore_sigterm,
    "cooperative": cooperative,
    "note_reason": note_reason,
    "spend": spend,
    "add_with_checkpoint": add_with_checkpoint,
    "crash": crash,
    "lose_pipe_then_crash": lose_pipe_then_crash,
    "whoami": whoami,
    "until_file": until_file,
    "wants_steps": wants_steps,
    "logs": logs,
}


def register(app: App, **options: Any) -> dict[str, Task]:
    """Register every handler here as ``proc.<name>`` process tasks of ``app``."""
    return {
        name: app.task(name=f"proc.{name}", executor="process", **options)(fn)
        for name, fn in NAMES.items()
    }
