"""Background upkeep that any worker may run: one small service per module."""

from tether.maintenance.rescuer import Rescuer

__all__ = ["Rescuer"]
