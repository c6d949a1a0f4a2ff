"""In-process wake-up hints.

Notifications are only hints (the database is the truth): a waiter that is woken
re-reads the database, and every waiter also wakes on a timeout and polls. A store
publishes here what it learns from LISTEN/NOTIFY (PostgreSQL) or from its own writes
(any store), and loops in any thread or event loop subscribe.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable

ENQUEUED = "enqueued"
"""Key: the queue name. A job became claimable."""
CONTROL = "control"
"""Key: the job id. A pause (or another control request) was made for a running job."""
CANCEL = "cancel"
"""Key: the job id. A cancel request for a running job was committed."""
CHANGED = "changed"
"""Key: the job id. A job changed state (other than by being claimed)."""

ANY = "*"


class Subscription:
    """Keys published on one channel since the last :meth:`get`, for one subscriber."""

    def __init__(self, hints: Hints, channel: str, keys: frozenset[str] | None) -> None:
        self._hints = hints
        self.channel = channel
        self.keys = keys
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._pending: set[str] = set()
        self._lock = threading.Lock()

    def _push(self, key: str) -> None:
        with self._lock:
            self._pending.add(key)
        self._loop.call_soon_threadsafe(self._event.set)

    def wants(self, key: str) -> bool:
        """Whether this subscriber cares about ``key``."""
        return key == ANY or self.keys is None or key in self.keys

    async def get(self, timeout: float | None) -> set[str]:
        """Wait up to ``timeout`` seconds; return the keys published meanwhile (maybe none)."""
        if not self._pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout)
        with self._lock:
            keys, self._pending = self._pending, set()
            self._event.clear()
        return keys

    def close(self) -> None:
        """Stop receiving."""
        self._hints._remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Hints:
    """A thread-safe publish/subscribe of keys on named channels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, list[Subscription]] = {}

    def subscribe(self, channel: str, keys: Iterable[str] | None = None) -> Subscription:
        """Subscribe in the running event loop; ``keys=None`` means every key."""
        sub = Subscription(self, channel, frozenset(keys) if keys is not None else None)
        with self._lock:
            self._subs.setdefault(channel, []).append(sub)
        return sub

    def publish(self, channel: str, keys: Iterable[str]) -> None:
        """Wake the subscribers of ``channel`` that want any of ``keys``."""
        with self._lock:
            subs = list(self._subs.get(channel, ()))
        if not subs:
            return
        for key in keys:
            for sub in subs:
                if sub.wants(key):
                    sub._push(key)

    def channels(self) -> set[str]:
        """The channels that have a subscriber right now (a store listens on these)."""
        with self._lock:
            return {channel for channel, subs in self._subs.items() if subs}

    def publish_all(self) -> None:
        """Wake every subscriber: used after a lost connection may have lost hints."""
        with self._lock:
            subs = [s for channel_subs in self._subs.values() for s in channel_subs]
        for sub in subs:
            sub._push(ANY)

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.channel, [])
            if sub in subs:
                subs.remove(sub)
