"""What the models of every route area share: the bounds of ids and integers, the types
of names and texts, the strict base of request bodies, and the error body."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from tether import names

MAX_ID = 2**63 - 1  # PostgreSQL's bigint
MAX_INT = 2**31 - 1  # PostgreSQL's integer

# Names end up in indexed text columns: printable, bounded, no NUL (PostgreSQL refuses it).
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
]
# Queues, keys, resources and tasks: the safe alphabet (see tether.names), so a name is
# always one URL path segment.
SafeName = Annotated[str, StringConstraints(pattern=names.NAME_PATTERN)]
Text = Annotated[str, StringConstraints(max_length=2000, pattern=r"^[^\x00]*$")]
JobId = Annotated[int, Field(ge=1, le=MAX_ID)]


class _In(BaseModel):
    # Unknown fields are mistakes worth reporting; NaN and infinity are not JSON. Strict:
    # no coercion, so `force: 0.0` or `"1"` is an error rather than a guess.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


# -- errors ------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    """Every error: a stable ``code``, a message for people, and the request's id."""

    code: str = Field(examples=["not_found"])
    message: str
    request_id: str | None = None
