"""The live OpenAPI schema, fuzzed by schemathesis with admin and member tokens.

Every operation (but the endless event stream) gets a bounded number of generated
requests against a real server; no answer may be a 5xx, and every answer must match the
schema: its status code, content type, headers and body.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conformance.conftest import _schema_url
from tether import App
from tether.auth import Tokens
from tether.states import JobState
from tether.web import ApiSettings, create_app

from .support import add_tasks, live_server, put_in_state

MAX_EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


async def _seed(url: str) -> dict[str, str]:
    """Tokens, and a few jobs in several states, so that generated ids hit real rows."""
    app = App(url)
    add_tasks(app)
    try:
        tokens = {}
        for name, role in (("root", "admin"), ("alice", "member")):
            tokens[role], _ = await Tokens(app).create(name, role)
        for i, state in enumerate(("queued", "paused", "failed", "running", "queued")):
            owner = "alice" if i % 2 else "root"
            job = await app.enqueue("echo", {"i": i}, owner=owner, queue=f"seed{i}")
            await put_in_state(app, job, JobState(state))
        return tokens
    finally:
        await app.close()


@pytest.fixture(scope="module")
def pg_fuzz_url(pg_conformance_db: str) -> Iterator[str]:
    """An empty schema of its own in the session's PostgreSQL test database."""
    schema = f"fuzz_{secrets.token_hex(4)}"
    with psycopg.connect(pg_conformance_db, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    yield _schema_url(pg_conformance_db, schema)
    with psycopg.connect(pg_conformance_db, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """A live server on a seeded database; yields its URL and a token per role."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('fuzz')}/tether.db"
    else:
        url = request.getfixturevalue("pg_fuzz_url")
    tokens = asyncio.run(_seed(url))
    app = App(url)
    add_tasks(app)
    limits = ApiSettings(rate_per_second=1e6, rate_burst=10**6, max_wait=0.2)
    with live_server(create_app(app, limits)) as base:
        yield base, tokens


@pytest.mark.slow
@pytest.mark.parametrize("role", ["admin", "member"])
def test_fuzzing_finds_no_server_error_and_no_schema_violation(
    server: tuple[str, dict[str, str]], role: str
) -> None:
    base, tokens = server
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json").exclude(path="/api/events")
    headers = {"Authorization": f"Bearer {tokens[role]}"}
    tested = 0
    statuses: dict[int, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Case) -> None:
            res = case.call_and_validate(base_url=base, headers=headers, checks=CHECKS)
            statuses[res.status_code] = statuses.get(res.status_code, 0) + 1

        check()
        tested += 1
    print(f"{role}: {tested} operations, answers by status: {dict(sorted(statuses.items()))}")
    assert tested >= 20 and sum(statuses.values()) >= tested * 5
    assert any(200 <= s < 300 for s in statuses) and not any(s >= 500 for s in statuses)
