"""API tokens: ``tether token create``, ``token list`` and ``token revoke``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from tether import display
from tether.cli.common import (
    AppOpt,
    DatabaseOpt,
    JsonOpt,
    cli_actor,
    fail,
    friendly,
    now_utc,
    open_app,
    run,
)
from tether.cli.output import err, listing, out, print_json
from tether.job import TokenInfo


@friendly
def token_create(
    name: Annotated[
        str,
        typer.Option(
            "--name",
            "-n",
            help="Who the token stands for; it owns the jobs it enqueues.",
            show_default=False,
        ),
    ],
    role: Annotated[
        str, typer.Option("--role", "-r", help="admin, member or viewer.", show_default=False)
    ],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create an API token and print it once: tether keeps only its hash."""
    from tether.audit import Audit
    from tether.auth import Tokens

    app = open_app(database, app_ref)

    async def go() -> tuple[str, TokenInfo]:
        token, info = await Tokens(app).create(name, role)
        await Audit(app).record(cli_actor(), "token.create", f"token:{name}", "ok",
                                detail=f"role {info.role}")  # fmt: skip
        return token, info

    token, info = run(app, go())
    if as_json:
        print_json({"name": info.name, "role": info.role, "token": token})
        return
    err.print(f"created {info.role} token {info.name!r}:")
    typer.echo(token)  # alone on stdout, so scripts can capture it
    err.print(
        Text(
            "store it now: it is shown only this once, and tether keeps only its hash",
            style="yellow",
        )
    )


@friendly
def token_list(
    database: DatabaseOpt = None, app_ref: AppOpt = None, as_json: JsonOpt = False
) -> None:
    """List tokens (names, roles and ages; never the tokens themselves)."""
    from tether.auth import Tokens

    app = open_app(database, app_ref)
    tokens = run(app, Tokens(app).list())
    now = now_utc()
    listing(
        tokens,
        ["name", "role", "created", "status"],
        lambda t: (
            t.name,
            t.role,
            display.age(t.created_at, now) + " ago",
            Text("active", style="green")
            if t.revoked_at is None
            else Text(f"revoked {display.age(t.revoked_at, now)} ago", style="grey50"),
        ),
        as_json=as_json,
        empty="no tokens (tether serve answers only on loopback, as an open admin)",
        json_value=[
            {"name": t.name, "role": t.role, "created_at": t.created_at, "revoked_at": t.revoked_at}
            for t in tokens
        ],
    )


@friendly
def token_revoke(
    name: Annotated[str, typer.Argument(help="The token's name.", show_default=False)],
    database: DatabaseOpt = None,
    app_ref: AppOpt = None,
) -> None:
    """Revoke a token at once: the next request that sends it gets 401."""
    from tether.audit import Audit
    from tether.auth import Tokens

    app = open_app(database, app_ref)

    async def go() -> bool:
        done = await Tokens(app).revoke(name)
        await Audit(app).record(
            cli_actor(), "token.revoke", f"token:{name}", "ok" if done else "not_found"
        )
        return done

    if not run(app, go()):
        fail(f"no active token named {name!r}")
    out.print(f"token {name!r} revoked")
