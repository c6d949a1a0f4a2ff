"""Background upkeep: one small service per module.

Every worker rescues and follows up cancellations; only the maintenance leader
(:mod:`tether.maintenance.leader`) prunes and fires schedules.
"""

from tether.maintenance.follow_up import CancellationFollowUp
from tether.maintenance.leader import LeaderElection
from tether.maintenance.pruner import Pruner
from tether.maintenance.rescuer import Rescuer
from tether.maintenance.scheduler import Scheduler

__all__ = ["CancellationFollowUp", "LeaderElection", "Pruner", "Rescuer", "Scheduler"]
