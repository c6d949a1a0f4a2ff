"""The App's facades: the parts of its API beyond enqueueing and running jobs, each
reached as an attribute of the App (``app.jobs``, ``app.queues``, ``app.cancellations``,
``app.schedules``, ``app.durable``, ``app.admin``)."""

from tether.facades.admin import Admin
from tether.facades.base import Facade
from tether.facades.cancellations import Cancellations
from tether.facades.durable import Durable
from tether.facades.jobs import Jobs
from tether.facades.queues import Queues
from tether.facades.schedules import Schedules

__all__ = ["Admin", "Cancellations", "Durable", "Facade", "Jobs", "Queues", "Schedules"]
