"""Fixtures for the API tests: an App with a few tasks, tokens for every role, and an
in-process ASGI client.

PostgreSQL tests share one migrated schema that is emptied before each test (as the
conformance suite does), because creating a database per test would cost more than the
tests themselves.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import pg_conformance_db, pg_migrated_url, pg_url
from tether import App, AppConfig
from tether.auth import Tokens
from tether.job import Job
from tether.states import JobState
from tether.web import ApiSettings, create_app

from .support import ROLES, Client, add_tasks, put_in_state

__all__ = ["pg_conformance_db", "pg_migrated_url", "pg_url"]


@pytest.fixture
async def tapp(db_url: str) -> AsyncIterator[App]:
    """An App with the test tasks; small payload limit, fast polls."""
    app = App(db_url, config=AppConfig(wait_poll_interval=0.05, max_payload_bytes=64 * 1024))
    add_tasks(app)
    yield app
    await app.close()


@pytest.fixture
async def tokens(tapp: App) -> dict[str, str]:
    """A token per principal: root (admin), alice and bob (members), eve (viewer)."""
    made = {}
    for name, role in ROLES.items():
        made[name], _ = await Tokens(tapp).create(name, role)
    return made


@pytest.fixture
def settings() -> ApiSettings:
    """The API's limits for a test (override in a module to change them)."""
    return ApiSettings(rate_per_second=10_000, rate_burst=10_000)


@pytest.fixture
async def client(tapp: App, settings: ApiSettings) -> AsyncIterator[Client]:
    """The API in process, through httpx's ASGI transport."""
    api = create_app(tapp, settings)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as http:
        yield Client(http)


@pytest.fixture
def authed(client: Client, tokens: dict[str, str]) -> Client:
    """The client, knowing every principal's token."""
    client.tokens = tokens
    return client


@pytest.fixture
def job_in(tapp: App, authed: Client) -> Callable[..., Awaitable[Job]]:
    """``await job_in("failed", owner="alice")``: a job of ``owner`` in that state, alone
    in a queue of its own."""

    async def make(state: str, owner: str = "alice", **body: Any) -> Job:
        body.setdefault("queue", f"q-{secrets.token_hex(4)}")
        res = await authed.post(owner, "/api/jobs", json={"task": "echo", **body})
        assert res.status_code == 201, res.text
        job = await tapp.get(res.json()["id"])
        return await put_in_state(tapp, job, JobState(state))

    return make
