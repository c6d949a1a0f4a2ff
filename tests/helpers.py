"""Small helpers shared by tests: fast worker settings and bounded polling."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tether import WorkerConfig

T = TypeVar("T")

FAST = {
    "concurrency": 4,
    "poll_interval": 0.1,
    "heartbeat_interval": 0.2,
    "lease_duration": 1.5,
    "self_fence_margin": 0.3,
    "rescue_interval": 0.1,
    "dead_session_grace": 0.5,
    "stop_timeout": 5.0,
    "cancel_grace": 0.3,
    "cancel_timeout": 1.0,
    "kill_timeout": 1.0,
}


def fast_config(**overrides: object) -> WorkerConfig:
    """Worker settings with short intervals, so tests finish in seconds."""
    return WorkerConfig(**{**FAST, **overrides})  # type: ignore[arg-type]


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, timeout: float = 10.0, every: float = 0.02
) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(every)


# A process in a PID namespace of its own, under this host name (as in a container that
# shares the host's name); --kill-child: it dies with the unshare process.
UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")


def can_unshare() -> bool:
    """Whether this machine lets us start a process in a new PID namespace."""
    try:
        done = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0
