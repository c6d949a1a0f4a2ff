"""The API and dashboard, served next to the demo's workers on the same event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

from tether.app import App

DEMO_PORT = 8000
"""Where the demo serves the API and dashboard (on 127.0.0.1; a free port if taken)."""


class WebServer:
    """uvicorn on the demo's own event loop, leaving its signals to the demo."""

    def __init__(self, tether_app: App, port: int) -> None:
        import uvicorn

        from tether.web import ApiSettings, create_app

        api = create_app(tether_app, ApiSettings())
        # No lifespan: the demo's workers share the app's store, which the server's
        # shutdown must not close.
        config = uvicorn.Config(
            api,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield  # the demo handles Ctrl-C itself

        self.server = Server(config)
        self.port = port
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen; returns once the server accepts connections."""
        self.task = asyncio.create_task(self.server.serve(), name="tether-demo-web")
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError("the dashboard did not start")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Close the server (open event streams are cut)."""
        self.server.should_exit = True
        self.server.force_exit = True
        if self.task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.task, 5)


def free_port(wanted: int) -> int:
    """``wanted`` if it is free on 127.0.0.1, else any free port."""
    for port in (wanted, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            found: int = sock.getsockname()[1]
            return found
    raise OSError("no free port on 127.0.0.1")
