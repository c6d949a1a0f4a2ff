"""``tether serve``: the REST API and the dashboard under uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from typing import Annotated

import typer
from rich.panel import Panel

from tether import display
from tether.cli.common import (
    EXIT_USAGE,
    AppOpt,
    DatabaseOpt,
    LogLevelOpt,
    PoolSizeOpt,
    fail,
    friendly,
    open_app,
    parse_log_level,
    run,
    set_pool_size,
)
from tether.cli.output import err
from tether.config import SERVE_POOL_SIZE


@friendly
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    log_level: LogLevelOpt = "info",
    docs: Annotated[
        bool,
        typer.Option(
            "--docs",
            help="Serve the interactive API docs at /docs and /redoc (they load scripts "
            "from a CDN); /openapi.json is always served.",
        ),
    ] = False,
    hide_totals: Annotated[
        bool,
        typer.Option(
            "--hide-totals-from-members",
            help="Refuse members /api/stats, /api/queues and /api/keys (counts and names "
            "of every principal's jobs).",
        ),
    ] = False,
    pool_size: PoolSizeOpt = None,
) -> None:
    """Run the REST API, the dashboard (at /), live events, /metrics and /health under
    uvicorn.

    Requests need a token from `tether token create`. While no token exists, it refuses
    to listen on anything but a loopback address, and on loopback every request acts as
    an admin (it says so loudly). Pass --app to enqueue jobs through the API: the server
    checks them against the app's tasks.
    """
    level = parse_log_level(log_level)
    from tether.auth import Tokens

    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    app = open_app(database, app_ref)
    set_pool_size(app, pool_size, default=SERVE_POOL_SIZE)
    has_tokens = run(app, Tokens(app).any_active())
    loopback = _is_loopback(host)
    if not has_tokens and not loopback:
        fail(
            f"refusing to listen on {host}: no API token exists, so anyone who reaches the "
            "server could act as admin. Create one first: tether token create --name NAME "
            "--role admin",
            EXIT_USAGE,
        )
    if not has_tokens:
        err.print(
            Panel(
                f"No API token exists: [bold]anyone who can reach {host}:{port} acts as "
                "admin[/]. Create a token (tether token create --name NAME --role admin) to "
                "require tokens.",
                title="tether serve is OPEN",
                style="bold red",
            )
        )
    logging.getLogger("tether.cli").info("database %s", display.redact_url(app.url))
    import uvicorn  # imported late: a refusal above should be quick

    from tether.web import ApiSettings, create_app
    from tether.web.app import server_config

    settings = ApiSettings(allow_anonymous=loopback, docs=docs, members_see_totals=not hide_totals)
    api = create_app(app, settings)
    uvicorn.Server(server_config(api, host, port, settings, log_level=level)).run()


def _is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
