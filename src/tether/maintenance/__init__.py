"""Background upkeep that any worker may run: one small service per module."""

from tether.maintenance.follow_up import CancellationFollowUp
from tether.maintenance.rescuer import Rescuer

__all__ = ["CancellationFollowUp", "Rescuer"]
