"""A background loop as a small service: ``run_once()`` for tests, ``run()`` for real."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from tether.config import DEFAULT_BACKOFF, LoopBackoff
from tether.store.driver import lock_wait


class Service:
    """Calls :meth:`run_once` every ``interval`` seconds until stopped.

    While ``run_once`` keeps failing (the database is down, say) the loop backs off
    exponentially as its ``backoff`` says (:class:`~tether.config.LoopBackoff`), and it
    logs the first failure, then at most one line per ``log_every`` seconds,
    then one line on recovery, so an outage cannot flood the logs.
    """

    name = "service"
    #: Seconds a statement of this loop's rounds may wait for a row lock another client
    #: holds (:data:`tether.store.driver.LOCK_WAIT`); ``None``: no bound of its own.
    lock_wait: float | None = None

    def __init__(
        self,
        interval: float,
        *,
        backoff: LoopBackoff = DEFAULT_BACKOFF,
        log_every: float = 30.0,
        logger: logging.Logger | None = None,
    ) -> None:
        self.interval = interval
        self.backoff = backoff
        self.log_every = log_every
        self.errors = 0
        self._last_log = -1e9
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self.log = logger or logging.getLogger(f"tether.{self.name}")

    async def run_once(self) -> Any:
        """Do one round of work."""
        raise NotImplementedError

    def due(self) -> bool:
        """Whether :meth:`run` should do a round now (a duty of the maintenance leader
        only says no on the others); :meth:`run_once` itself always works."""
        return True

    async def round(self) -> None:
        """One round as :meth:`run` makes it: :meth:`run_once` if :meth:`due`, else
        :meth:`off_duty`, with the store's row-lock waits bounded by :attr:`lock_wait`."""
        with lock_wait(self.lock_wait):
            if self.due():
                await self.run_once()
            else:
                await self.off_duty()

    async def off_duty(self) -> None:
        """What :meth:`run` does instead of a round while :meth:`due` says no: nothing,
        unless a service keeps watch meanwhile (the rescuer does)."""

    def wake(self) -> None:
        """Run the next round now instead of at the end of the interval."""
        self._wake.set()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current round."""
        self._stop.set()
        self._wake.set()

    def delay(self) -> float:
        """Seconds until the next round, given the recent errors."""
        return self.backoff.delay(self.interval, self.errors)

    async def run(self) -> None:
        """Loop until :meth:`stop`; never raises for a failed round."""
        while not self._stop.is_set():
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc)
            else:
                self._recovered()
            if self._wake.is_set():
                # Woken during the round: go again after one turn of the loop, without
                # the timer and task a wait would cost.
                await asyncio.sleep(0)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.delay())
            self._wake.clear()

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        now = time.monotonic()
        if self.errors == 1 or now - self._last_log >= self.log_every:
            self._last_log = now
            self.log.warning(
                "%s failed (%d in a row, next try in %.1fs): %s",
                self.name,
                self.errors,
                self.delay(),
                exc,
            )

    def _recovered(self) -> None:
        if self.errors:
            self.log.info("%s recovered after %d failed rounds", self.name, self.errors)
        self.errors = 0
