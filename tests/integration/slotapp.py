"""A worker process whose jobs hold a resource slot, for the SIGKILL rescue test.

Run as ``python -m tests.integration.slotapp`` with ``TETHER_DATABASE_URL`` set. With
``SLOTAPP_HANG=1`` (the worker process to be killed) every ``hold`` job hangs; anywhere
else it returns at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import tether
from tests.helpers import fast_config
from tether import App, Worker

CAPACITY = 1


def build_app(url: str) -> App:
    """The app every process of the test shares: one ``repo`` slot."""
    app = App(url)
    app.resource("repo", capacity=CAPACITY)

    @app.task(name="hold", resources=["repo"], max_attempts=3)
    async def hold(ctx: tether.JobContext) -> int:
        if os.environ.get("SLOTAPP_HANG") == "1":
            await asyncio.sleep(3600)
        return ctx.attempt

    return app


async def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app = build_app(os.environ["TETHER_DATABASE_URL"])
    worker = Worker(app, fast_config(concurrency=2))
    await worker.run(handle_signals=True)


if __name__ == "__main__":
    asyncio.run(main())
