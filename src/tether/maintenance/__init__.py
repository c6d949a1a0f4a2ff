"""Background upkeep: one small service per module.

Only the maintenance leader (:mod:`tether.maintenance.leader`) rescues, follows up
cancellations, prunes, fires schedules and releases blocked jobs that a missed workflow
step left behind; every worker watches the heartbeat counters meanwhile, so whoever
takes over the lead can rescue at once.
"""

from tether.maintenance.follow_up import CancellationFollowUp
from tether.maintenance.leader import LeaderElection
from tether.maintenance.pruner import Pruner
from tether.maintenance.releaser import Releaser
from tether.maintenance.rescuer import Rescuer
from tether.maintenance.scheduler import Scheduler

__all__ = ["CancellationFollowUp", "LeaderElection", "Pruner", "Releaser", "Rescuer", "Scheduler"]
