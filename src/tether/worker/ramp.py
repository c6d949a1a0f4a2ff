"""The gradual start: how fast a freshly started worker may claim its backlog."""

from __future__ import annotations

from tether.config import WorkerConfig


class Ramp:
    """A gradual start: how many jobs a worker may have claimed ``elapsed`` seconds in.

    The first job at once, jobs 2 to ``warm_jobs`` one per ``warm_interval``, then the
    rest of the backlog found at start spread evenly over ``window`` seconds; after
    that, no limit. A window of 0 turns the ramp off.
    """

    def __init__(self, config: WorkerConfig, backlog: int) -> None:
        self.window = config.ramp_window
        self.warm_jobs = config.ramp_warm_jobs
        self.warm_interval = config.ramp_warm_interval
        self.rest = max(0, backlog - self.warm_jobs)

    @property
    def warm_time(self) -> float:
        """Seconds until the warm phase has let ``warm_jobs`` jobs start."""
        return (self.warm_jobs - 1) * self.warm_interval

    def allowed(self, elapsed: float) -> int | None:
        """Jobs that may have been claimed by now; ``None`` once the ramp is over."""
        if self.window <= 0 or elapsed >= self.warm_time + self.window:
            return None
        if elapsed < self.warm_time:
            return 1 + int(elapsed / self.warm_interval)
        return self.warm_jobs + int(self.rest * (elapsed - self.warm_time) / self.window)

    def next_step(self, elapsed: float) -> float:
        """Seconds until :meth:`allowed` may grow."""
        if elapsed < self.warm_time:
            return self.warm_interval - (elapsed % self.warm_interval)
        if self.rest == 0:
            return self.warm_time + self.window - elapsed
        return self.window / self.rest
