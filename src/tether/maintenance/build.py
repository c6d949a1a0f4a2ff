"""One worker's maintenance services, built together and started and stopped as one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tether.cancellation import CancellationService
from tether.config import WorkerConfig
from tether.maintenance.follow_up import CancellationFollowUp
from tether.maintenance.leader import LeaderElection
from tether.maintenance.pruner import Pruner
from tether.maintenance.releaser import Releaser
from tether.maintenance.rescuer import Rescuer
from tether.maintenance.scheduler import Scheduler
from tether.service import Service
from tether.store.protocols import CancellationStore, JobStore, MaintenanceStore, ScheduleStore

if TYPE_CHECKING:
    from tether.host import Host


class MaintainerStore(MaintenanceStore, ScheduleStore, JobStore, CancellationStore, Protocol):
    """What the maintenance services touch together: rescue, the leader's lease and
    retention; the schedules and the jobs they enqueue; the cancellation records."""


@dataclass(frozen=True)
class Maintenance:
    """The maintenance services of one worker. Every worker runs them all; the
    maintenance leader (:attr:`leader`) rescues, follows up cancellations, prunes,
    fires schedules and releases what a missed workflow step left blocked, while the
    others only watch the beat counters (the rescuer) and record their app's schedules
    (the scheduler)."""

    leader: LeaderElection
    rescuer: Rescuer
    follow_up: CancellationFollowUp
    pruner: Pruner
    scheduler: Scheduler
    releaser: Releaser

    @property
    def services(self) -> tuple[Service, ...]:
        """Every service, in the order they start."""
        return (
            self.rescuer,
            self.follow_up,
            self.leader,
            self.pruner,
            self.scheduler,
            self.releaser,
        )

    def start(self) -> list[asyncio.Task[None]]:
        """Start every service's loop; the tasks end once :meth:`stop` was called (or
        when cancelled)."""
        return [asyncio.create_task(s.run(), name=f"tether-{s.name}") for s in self.services]

    def stop(self) -> None:
        """Ask every loop to return after its current round."""
        for service in self.services:
            service.stop()

    def wake(self) -> None:
        """Run every loop's next round now (the database answers again)."""
        for service in self.services:
            service.wake()


def build_maintenance(
    app: Host, store: MaintainerStore, holder: str, config: WorkerConfig
) -> Maintenance:
    """The maintenance services of the worker ``holder`` of ``app``, with its
    ``config``: they share its backoff (the pruner keeps its own, see
    :mod:`tether.maintenance.pruner`) and the app's ``MaintenanceConfig``."""
    maintenance = app.config.maintenance
    backoff = config.backoff
    leader = LeaderElection(
        store,
        holder,
        ttl=maintenance.leader_ttl,
        interval=maintenance.leader_renew_interval,
        backoff=backoff,
    )
    cancellations = CancellationService(
        store,
        app.config.wait_poll_interval,
        adopt_after=app.config.cancellation_adopt_after,
        retry=app.config.cancellation_retry,
    )
    built = Maintenance(
        leader=leader,
        rescuer=Rescuer(
            store,
            interval=config.rescue_interval,
            session_grace=config.session_dead_after,
            leader=leader,
            lease=config.lease_duration,
            backoff=backoff,
            hooks=app.hooks,
        ),
        follow_up=CancellationFollowUp(
            cancellations, interval=config.rescue_interval, leader=leader, backoff=backoff
        ),
        pruner=Pruner(store, app.config.retention, leader=leader),
        scheduler=Scheduler(
            app,
            store,
            interval=maintenance.schedule_interval,
            leader=leader,
            holder=holder,
            backoff=backoff,
        ),
        releaser=Releaser(
            store,
            interval=maintenance.release_interval,
            batch_size=maintenance.release_batch,
            leader=leader,
            backoff=backoff,
        ),
    )
    # No maintenance statement waits on a row lock without a bound (see LOCK_WAIT).
    for service in built.services:
        service.lock_wait = maintenance.lock_wait
    return built
