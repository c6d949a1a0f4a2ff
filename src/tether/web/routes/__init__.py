"""The API's routes, one module per area; ``ERRORS`` documents every error answer."""

from __future__ import annotations

from typing import Any

from tether.web.models import ErrorBody

_DESCRIPTIONS = {
    400: "Bad request",
    401: "Missing, invalid or revoked token (code `unauthorized`)",
    403: "The token's role may not do this (code `forbidden`)",
    404: "No such job, or one the token may not see (code `not_found`)",
    409: "Not legal in the job's state (code `illegal_transition`)",
    413: "Body or payload too large (code `payload_too_large`)",
    422: "Invalid input (codes `invalid_request`, `invalid_job`, `unknown_task`)",
    429: "Rate limited (code `rate_limited`; see Retry-After)",
    500: "Internal error (code `internal_error`; never a stack trace)",
    503: "The database is unavailable (code `store_unavailable`)",
}
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in _DESCRIPTIONS.items()
}
