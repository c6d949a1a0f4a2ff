"""JSON errors with stable codes; a request never sees a stack trace.

Every error body is ``{"code": ..., "message": ..., "request_id": ...}``. Codes are part
of the API: clients branch on them, so they never change meaning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from tether.errors import (
    ConfigError,
    IllegalTransitionError,
    InvalidJobError,
    JobNotFoundError,
    LeaseLostError,
    PayloadTooLargeError,
    ScheduleNotFoundError,
    SignalConflictError,
    StoreError,
    TetherError,
    UnknownTaskError,
    WaitTimeoutError,
)
from tether.web.models import ErrorBody

log = logging.getLogger("tether.web")

# (exception type, HTTP status, code), most specific first.
TETHER_ERRORS: tuple[tuple[type[TetherError], int, str], ...] = (
    (JobNotFoundError, 404, "not_found"),
    (ScheduleNotFoundError, 404, "not_found"),
    (IllegalTransitionError, 409, "illegal_transition"),
    (SignalConflictError, 409, "signal_conflict"),
    (PayloadTooLargeError, 413, "payload_too_large"),
    (UnknownTaskError, 422, "unknown_task"),
    (InvalidJobError, 422, "invalid_job"),
    (ConfigError, 422, "invalid_request"),
    (LeaseLostError, 409, "lease_lost"),
    (WaitTimeoutError, 408, "wait_timeout"),
    (StoreError, 503, "store_unavailable"),
)
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal_error",
    503: "store_unavailable",
}


class ApiError(Exception):
    """An error answered as JSON. ``denied`` marks an authorization refusal, which the
    audit log records even where the answer is a plain 404."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        denied: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.denied = denied
        self.headers = headers


def classify(exc: BaseException) -> tuple[int, str, str]:
    """``(status, code, message)`` for any exception a route may raise."""
    if isinstance(exc, ApiError):
        return exc.status, exc.code, exc.message
    for kind, status, code in TETHER_ERRORS:
        if isinstance(exc, kind):
            if status == 503:
                # The store's message may name hosts and drivers; the log keeps it.
                return status, code, "the database is unavailable; try again shortly"
            return status, code, str(exc)
    if isinstance(exc, TetherError):
        return 400, "bad_request", str(exc)
    return 500, "internal_error", "internal error"


def error_response(
    request_id: str | None,
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The JSON answer for one error."""
    body = ErrorBody(code=code, message=message, request_id=request_id)
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def request_id_of(request: Request) -> str | None:
    """The id the guardrails middleware gave this request."""
    return getattr(request.state, "request_id", None)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(request_id_of(request), exc.status, exc.code, exc.message, exc.headers)


async def _tether_error(request: Request, exc: Exception) -> JSONResponse:
    status, code, message = classify(exc)
    if status >= 500:
        log.warning("request %s: %s: %s", request_id_of(request), type(exc).__name__, exc)
    return error_response(request_id_of(request), status, code, message)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Say where and what, never echo the input: it may be large or sensitive.
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    message = "; ".join(parts) or "invalid request"
    return error_response(request_id_of(request), 422, "invalid_request", message)


def allowed_methods(request: Request) -> set[str]:
    """Every method some route answers at this request's path. (The framework names
    only the methods of the first route whose path matches.)"""
    routes = request.app.router.routes
    allowed = set()
    for method in METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in routes):
            allowed.add(method)
    return allowed


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = HTTP_CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(sorted(allowed_methods(request))) or headers.get("Allow", "")
    return error_response(request_id_of(request), exc.status_code, code, message, headers)


def install(app: FastAPI) -> None:
    """Register the handlers that turn exceptions into JSON errors."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(TetherError, _tether_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
