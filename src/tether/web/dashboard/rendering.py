"""Pages as HTML: the Jinja2 templates and their filters, the security headers every
response carries, and the small answers pages and actions share."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path as FilePath
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse

from tether import display
from tether.web.dashboard.sessions import Visitor

# The web package's folder, which holds templates/ and static/.
HERE = FilePath(__file__).parents[1]
BULK_CANCEL_MAX = 50
"""The most jobs one bulk cancel may name."""
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def _now() -> datetime:
    return datetime.now(UTC)


def _age(at: datetime | None) -> str:
    if at is None:
        return ""
    secs = (_now() - at).total_seconds()
    if secs < 0:
        return f"in {_span(-secs)}"
    return f"{_span(secs)} ago"


def _span(secs: float) -> str:
    if secs < 60:
        return f"{secs:.1f}s"
    if secs < 3600:
        return f"{secs / 60:.0f}m"
    if secs < 86400:
        return f"{secs / 3600:.1f}h"
    return f"{secs / 86400:.1f}d"


def _when(at: datetime | str | None) -> str:
    if at is None:
        return ""
    if isinstance(at, str):
        return at.replace("T", " ")[:23]
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


templates.filters["age"] = _age
templates.filters["when"] = _when
templates.filters["pretty"] = _pretty
# One URL path segment: "/" and every other reserved character percent-encoded (Jinja's
# urlencode leaves "/" as it is).
templates.filters["seg"] = lambda v: quote(str(v), safe="")
templates.filters["took"] = lambda step: (
    display.took(step.started_at, step.finished_at) if step.finished_at else ""
)
templates.filters["compact"] = lambda v: json.dumps(v, sort_keys=True, default=str)[:160]


def render(v: Visitor | None, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A page (or, with ``?fragment=1``, only its live part), with the security headers."""
    flashes: list[tuple[str, str]] = []
    # A live region's refresh (a fragment) shows no flashes, so it must not take them:
    # one arriving between an action and its redirect would swallow the message.
    if v is not None and not name.endswith("_live.html"):
        flashes, v.session.flash = v.session.flash, []
    html = templates.get_template(name).render(
        v=v,
        me=v.principal if v else None,
        csrf=v.session.csrf if v else "",
        flashes=flashes,
        bulk_max=BULK_CANCEL_MAX,
        totals_hidden=v is not None and _totals_hidden(v),
        **context,
    )
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _totals_hidden(v: Visitor) -> bool:
    return v.principal.owner_filter is not None and not v.api.settings.members_see_totals


def fragment(request: Request) -> bool:
    """Whether the page asked for only its live region (the live-update script does)."""
    return request.query_params.get("fragment") == "1"


def redirect(url: str) -> RedirectResponse:
    """A 303 back to a page after a POST."""
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)
