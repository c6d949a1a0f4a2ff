"""The API's limits, with named defaults."""

from __future__ import annotations

from dataclasses import dataclass

from tether.errors import ConfigError

MAX_PAGE_SIZE = 1000
"""The most rows one listing returns (the ``limit`` query parameter's maximum)."""
MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ApiSettings:
    """Limits and switches of one API server.

    ``allow_anonymous`` lets requests without a token act as the admin ``anonymous``
    while no token exists; ``tether serve`` turns it on for loopback addresses only.
    """

    max_body_bytes: int = MAX_BODY_BYTES
    # Per token (or, before a token is known, per client address): a token bucket.
    rate_per_second: float = 50.0
    rate_burst: int = 200
    # Floors: no stream or wait polls the database more often than this...
    min_poll_interval: float = 0.25
    # ...and no request waits longer than this.
    max_wait: float = 60.0
    # A comment line on idle event streams, so proxies keep them open.
    sse_keepalive: float = 15.0
    allow_anonymous: bool = False
    # /api/stats, /api/queues and /api/keys count every principal's jobs and name every
    # queue and key. Off: members get 403 there (admins and viewers see all anyway).
    members_see_totals: bool = True
    # /docs and /redoc load their scripts from a CDN; off by default (the OpenAPI schema
    # is always at /openapi.json). `tether serve --docs` turns them on.
    docs: bool = False
    # The most bytes of request headers the server reads; longer gets a plain 400 from the
    # HTTP server. An Authorization header over MAX_AUTH_HEADER gets the API's JSON 401.
    max_header_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "rate_per_second", "rate_burst", "min_poll_interval"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive")
        if self.max_wait < 0 or self.sse_keepalive <= 0:
            raise ConfigError("max_wait must not be negative, sse_keepalive must be positive")
