"""Background upkeep: one small service per module, built together for a worker by
:func:`build_maintenance` (:mod:`tether.maintenance.build`).

Only the maintenance leader (:mod:`tether.maintenance.leader`) rescues, follows up
cancellations, prunes, fires schedules and releases pending workflow steps (and the
blocked jobs a missed step left behind); every worker watches the heartbeat counters
meanwhile, so whoever takes over the lead can rescue at once, and records its app's
schedules.
"""

from tether.maintenance.build import MaintainerStore, Maintenance, build_maintenance
from tether.maintenance.follow_up import CancellationFollowUp
from tether.maintenance.leader import Duty, LeaderElection
from tether.maintenance.pruner import Pruner
from tether.maintenance.releaser import Releaser
from tether.maintenance.rescuer import Rescuer
from tether.maintenance.scheduler import Scheduler

__all__ = [
    "CancellationFollowUp",
    "Duty",
    "LeaderElection",
    "MaintainerStore",
    "Maintenance",
    "Pruner",
    "Releaser",
    "Rescuer",
    "Scheduler",
    "build_maintenance",
]
