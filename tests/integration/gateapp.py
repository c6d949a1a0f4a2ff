"""A worker process whose one task waits at a gate the test opens.

Run as ``python -m tests.integration.gateapp`` with ``TETHER_DATABASE_URL`` and
``TETHER_GATE_DIR`` set. Every attempt of ``gated`` appends ``job attempt lease_token``
to ``starts.log`` in that directory, then waits until the file ``open`` exists there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

import tether
from tests.helpers import fast_config
from tether import App, Worker


def build_app(url: str) -> App:
    """The app the test and its worker processes share."""
    app = App(url)
    gate_dir = os.environ.get("TETHER_GATE_DIR", ".")

    @app.task(name="gated", max_attempts=3, executor="thread")
    def gated(ctx: tether.JobContext) -> int:
        line = f"{ctx.id} {ctx.attempt} {ctx.job.lease_token}\n"
        fd = os.open(os.path.join(gate_dir, "starts.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        # Another process opens the gate: a file is the signal both PID namespaces see.
        while not os.path.exists(os.path.join(gate_dir, "open")):
            ctx.check_cancelled()
            time.sleep(0.02)
        return ctx.attempt

    return app


async def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app = build_app(os.environ["TETHER_DATABASE_URL"])
    await Worker(app, fast_config(concurrency=1, claim_batch=1)).run(handle_signals=True)


if __name__ == "__main__":
    asyncio.run(main())
