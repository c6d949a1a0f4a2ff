"""A worker process running the ``executor="process"`` handlers of ``proc_tasks``.

Run as ``python -m tests.integration.proc_worker`` with ``TETHER_DATABASE_URL`` set and
optionally ``TETHER_KILL_TIMEOUT`` (seconds from SIGTERM to SIGKILL). The tests that
kill a job's child process run their worker here, in a process of its own, so that a
worker that wedges cannot take the test run down with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from tests.helpers import fast_config
from tests.integration.proc_tasks import register
from tether import App, Worker


def build_app(url: str) -> App:
    """The app both the test and the worker process use."""
    app = App(url)
    register(app, max_attempts=1)
    return app


async def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app = build_app(os.environ["TETHER_DATABASE_URL"])
    kill_timeout = float(os.environ.get("TETHER_KILL_TIMEOUT", "1.0"))
    worker = Worker(app, fast_config(kill_timeout=kill_timeout))
    await worker.run(handle_signals=True)


if __name__ == "__main__":
    asyncio.run(main())
