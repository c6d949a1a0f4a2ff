"""Helpers for the API tests."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from tether import App, Fail
from tether.job import Job, Outcome
from tether.states import JobState

ROLES = {"root": "admin", "alice": "member", "bob": "member", "eve": "viewer"}


def add_tasks(app: App) -> None:
    """The tasks the API tests enqueue."""

    @app.task(name="echo")
    async def echo(ctx: Any, **args: Any) -> Any:
        return args

    @app.task(name="sleepy")
    async def sleepy(ctx: Any, seconds: float = 30.0) -> None:
        await asyncio.sleep(seconds)

    @app.task(name="boom")
    async def boom(ctx: Any) -> None:
        raise Fail("boom")


@dataclass
class Client:
    """An httpx client that sends the token of the principal named in each call."""

    http: httpx.AsyncClient
    tokens: dict[str, str] | None = None

    def headers(self, who: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The Authorization header for ``who`` (a principal's name, or a raw token)."""
        headers = dict(extra or {})
        if who is not None:
            token = (self.tokens or {}).get(who, who)
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def request(
        self, method: str, who: str | None, path: str, **kwargs: Any
    ) -> httpx.Response:
        """One request as ``who``."""
        headers = self.headers(who, kwargs.pop("headers", None))
        return await self.http.request(method, path, headers=headers, **kwargs)

    async def get(self, who: str | None, path: str, **kwargs: Any) -> httpx.Response:
        """GET as ``who``."""
        return await self.request("GET", who, path, **kwargs)

    async def post(self, who: str | None, path: str, **kwargs: Any) -> httpx.Response:
        """POST as ``who``."""
        return await self.request("POST", who, path, **kwargs)

    async def delete(self, who: str | None, path: str, **kwargs: Any) -> httpx.Response:
        """DELETE as ``who``."""
        return await self.request("DELETE", who, path, **kwargs)


async def put_in_state(app: App, job: Job, state: JobState) -> Job:
    """Move a fresh queued job to ``state`` through the store, as a worker would."""
    store = await app.store()
    if state is JobState.QUEUED:
        return job
    if state is JobState.PAUSED:
        return await app.jobs.pause(job.id)
    if state is JobState.CANCELLED:
        return (await app.cancel(job.id)).job
    # Claim it in a queue of its own, so no other job is taken.
    [claimed] = await store.claim("test-worker", [job.queue], [job.task], 1, 60.0)
    assert claimed.id == job.id, (claimed.id, job.id)
    if state is JobState.RUNNING:
        return claimed
    outcome = Outcome(claimed.id, claimed.lease_token, state, error="boom")
    assert await store.finish("test-worker", [outcome]) == {job.id}
    return await app.get(job.id)


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def live_server(asgi: Any, config: uvicorn.Config | None = None) -> Iterator[str]:
    """Run ``asgi`` under uvicorn in a thread (its own event loop); yields the base URL.
    ``config`` replaces the default configuration (its port must be free)."""
    port = config.port if config is not None else free_port()
    config = config or uvicorn.Config(
        asgi, host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    # Off the main thread, uvicorn leaves signal handling to pytest.
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="tether-test-server", daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        if not thread.is_alive():
            raise RuntimeError("the test server did not start")
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


async def dashboard_login(client: Client, who: str) -> httpx.AsyncClient:
    """The client's httpx client, logged in to the dashboard as ``who`` (a principal
    whose token ``client.tokens`` knows)."""
    http: httpx.AsyncClient = client.http
    http.cookies.clear()
    page = await http.get("/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert nonce is not None
    token = (client.tokens or {})[who]
    res = await http.post("/login", data={"token": token, "csrf": nonce.group(1)})
    assert res.status_code == 303, res.text
    return http
