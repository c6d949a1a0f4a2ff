"""What a cancellation did, counted from the job rows it saw (pure).

The one count behind every account of a cancellation: the steps of the canceller that
drives it, the settling of a record whose canceller is gone, and the follow-up of a
record that settled while its jobs still ran.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tether.job import Job
from tether.states import JobState

#: The states a cancel request still changes.
LIVE = frozenset(
    {JobState.QUEUED, JobState.BLOCKED, JobState.RUNNING, JobState.RETRYING, JobState.PAUSED}
)
#: How a worker says it stopped a handler (``Job.stopped_by``); a job stopped so was a
#: runner, whether or not the canceller saw it running.
STOPPED_BY = frozenset({"task_cancelled", "sigterm", "sigkill", "abandoned"})


@dataclass(frozen=True)
class Tally:
    """What became of the jobs a cancellation reached, by job id.

    ``runners_terminated`` names each stopped runner (``job 7 on w-1 (sigterm)``);
    ``abandoned`` the stopped runners whose handler ignored the request;
    ``had_runner`` whether there was any runner to stop at all.
    """

    cancelled: list[int]
    completed: list[int]
    failed: list[int]
    runners_terminated: list[str]
    slots_released: list[str]
    dependents_blocked: list[int]
    still_running: list[int]
    abandoned: list[int]
    had_runner: bool


def tally(
    job_id: int,
    final: Sequence[Job],
    downstream: Sequence[Job],
    *,
    was_running: Collection[int],
    cascade: bool,
) -> Tally:
    """Count what a cancellation of ``job_id`` did.

    ``final``: the jobs it reached, as they are now; ``downstream``: the jobs that
    depend on it, as they were once it asked; ``was_running``: the ids known to have
    been running when it asked.
    """
    running = [j for j in final if j.state is JobState.RUNNING]
    # A job that succeeded ended on its own, before the request reached it: there was
    # no runner left to stop.
    stopped = [
        j
        for j in final
        if j.state not in (JobState.RUNNING, JobState.SUCCEEDED)
        and (j.id in was_running or j.stopped_by in STOPPED_BY)
    ]
    had_runner = job_id in was_running or bool(stopped)
    # The database releases a job's slots as it leaves running.
    released = (
        sorted({lim for j in final if j.state is not JobState.RUNNING for lim in j.limits})
        if had_runner
        else []
    )
    return Tally(
        cancelled=[j.id for j in final if j.state is JobState.CANCELLED],
        completed=[j.id for j in final if j.state is JobState.SUCCEEDED],
        failed=[j.id for j in final if j.state is JobState.FAILED],
        runners_terminated=[f"job {j.id} on {j.worker_id} ({j.stopped_by})" for j in stopped],
        slots_released=released,
        dependents_blocked=[
            d.id for d in downstream if d.state is JobState.BLOCKED and not cascade
        ],
        still_running=[j.id for j in running],
        abandoned=[j.id for j in stopped if j.stopped_by == "abandoned"],
        had_runner=had_runner,
    )
