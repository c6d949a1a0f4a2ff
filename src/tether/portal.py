"""A private event loop on a daemon thread, so sync callers can use the async core."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Portal:
    """Runs coroutines on one background loop and blocks the caller for the result."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="tether-portal", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the portal loop and return its result."""
        loop = self._ensure()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()
            raise RuntimeError("a sync tether call was made from tether's own portal loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def close(self) -> None:
        """Stop the loop; later calls start a new one."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
