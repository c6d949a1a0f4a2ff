"""A per-principal token bucket: ``rate`` requests a second, bursts up to ``burst``."""

from __future__ import annotations

import threading
import time

MAX_KEYS = 10_000


class RateLimiter:
    """Token buckets by key (a token's name, or a client address before one is known)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> float | None:
        """Spend one request; ``None`` if allowed, else the seconds until one is."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                self._prune(now)
                return None
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate

    def _prune(self, now: float) -> None:
        # Bounded memory under many client addresses: a full bucket carries no state.
        if len(self._buckets) <= MAX_KEYS:
            return
        refill = self.burst / self.rate
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < refill}
