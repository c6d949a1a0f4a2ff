"""Request bodies too deep to parse safely are refused before anything parses them.

A JSON parser recurses once per level of nesting, so whether it copes with a deep body
depends on how much stack it has left: a tracer (coverage's) or a deeper caller leaves
less, and the request would fail with a generic 400 instead of tether's answer. The
scan below needs no stack, so a body nesting deeper than a payload may is refused the
same way, 422 ``invalid_job``, whatever runs the server.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from tether import payload
from tether.web.errors import ApiError

#: A payload (a job's args, a schedule's) sits one level inside the request's object.
BODY_DEPTH = payload.MAX_DEPTH + 1


class JsonRoute(APIRoute):
    """An API route whose JSON body is checked for depth before it is parsed."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        parse_and_run = super().get_route_handler()

        async def handler(request: Request) -> Response:
            # Read once: the request keeps the body, and the parse below reuses it.
            body = await request.body()
            if body and payload.text_depth_over(body, BODY_DEPTH):
                raise ApiError(
                    422, "invalid_job", f"the payload cannot be stored: {payload.TOO_DEEP}"
                )
            return await parse_and_run(request)

        return handler
