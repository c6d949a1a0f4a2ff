"""tether's network interface: the REST API, live events, metrics and health.

``create_app(tether_app)`` builds the ASGI app that ``tether serve`` runs under uvicorn.
"""

from tether.web.app import create_app
from tether.web.settings import ApiSettings

__all__ = ["ApiSettings", "create_app"]
