"""The ``tether`` command: run workers, enqueue and inspect jobs, cancel them, run the demo.

This module is the command tree: which command lives where, in the order ``--help``
lists them. Each command group is a module of its own; what they share (options,
opening the App, errors and exit codes) is in :mod:`tether.cli.common`, and how they
print (tables, JSON) in :mod:`tether.cli.output`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from tether.cli import (
    audit,
    cancel,
    demo,
    joblogs,
    jobs,
    keys,
    maintenance,
    queues,
    rate_limits,
    schedules,
    serve,
    tokens,
    worker,
)
from tether.cli.common import EXIT_FAILED, EXIT_USAGE, fail, friendly, open_app, run, set_pool_size

__all__ = [
    "EXIT_FAILED",
    "EXIT_USAGE",
    "cli",
    "fail",
    "friendly",
    "main",
    "open_app",
    "run",
    "set_pool_size",
]

_COMMANDS: tuple[Callable[..., Any], ...] = (
    worker.worker,
    maintenance.migrate,
    jobs.enqueue,
    jobs.stats,
    worker.workers,
    demo.demo,
    serve.serve,
    audit.audit,
    maintenance.prune,
)
"""The top-level commands, named after their functions."""

_GROUPS: dict[str, tuple[str, dict[str, Callable[..., Any]]]] = {
    "job": (
        "Inspect and steer jobs.",
        {
            "list": jobs.job_list,
            "show": jobs.job_show,
            "cancel": cancel.job_cancel,
            "cancel-status": cancel.job_cancel_status,
            "cancellations": cancel.job_cancellations,
            "pause": jobs.job_pause,
            "resume": jobs.job_resume,
            "retry": jobs.job_retry,
            "delete": jobs.job_delete,
            "wait": jobs.job_wait,
            "signal": jobs.job_signal,
            "logs": joblogs.job_logs,
        },
    ),
    "queue": (
        "List, pause and resume queues.",
        {"list": queues.queue_list, "pause": queues.queue_pause, "resume": queues.queue_resume},
    ),
    "key": (
        "Concurrency keys and resource slots.",
        {"list": keys.key_list, "configure": keys.key_configure},
    ),
    "rate-limit": (
        "Rate limits: how fast jobs of a queue or task may start, across every worker.",
        {
            "set": rate_limits.rate_limit_set,
            "remove": rate_limits.rate_limit_remove,
            "list": rate_limits.rate_limit_list,
        },
    ),
    "token": (
        "API tokens: create, list and revoke.",
        {"create": tokens.token_create, "list": tokens.token_list, "revoke": tokens.token_revoke},
    ),
    "schedule": (
        "Periodic schedules: list, pause, resume and remove.",
        {
            "list": schedules.schedule_list,
            "pause": schedules.schedule_pause,
            "resume": schedules.schedule_resume,
            "remove": schedules.schedule_remove,
        },
    ),
}
"""The command groups (``tether job ...``): their help and their commands."""


def _build() -> typer.Typer:
    """The ``tether`` app; ``--help`` lists the commands in the order above."""
    app = typer.Typer(
        name="tether",
        help="tether: a durable job queue where every running job can be stopped safely.",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode="markdown",
        # Tracebacks are for bugs; locals would dump job payloads and URLs to the terminal.
        pretty_exceptions_show_locals=False,
    )
    for command in _COMMANDS:
        app.command()(command)
    for group_name, (help_text, commands) in _GROUPS.items():
        group = typer.Typer(help=help_text, no_args_is_help=True)
        for command_name, command in commands.items():
            group.command(command_name)(command)
        app.add_typer(group, name=group_name)
    return app


cli = _build()
"""The ``tether`` command as a Typer app."""


def main() -> None:
    """Entry point of the ``tether`` script."""
    cli()
