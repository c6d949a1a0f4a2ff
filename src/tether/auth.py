"""API tokens and roles: who a request acts as, and what that principal may do.

A token is shown once, when it is created, and stored only as the SHA-256 of its text:
a database dump reveals no usable token. The token carries 256 random bits, so a plain
hash is enough (there is nothing to brute-force, unlike a password). Lookups go by hash,
and the stored hash is compared again in constant time.

Roles:

- ``admin`` acts on every job, queue and the audit log;
- ``member`` enqueues jobs and acts only on the jobs it enqueued (it owns them);
- ``viewer`` only reads.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tether.errors import ConfigError
from tether.job import Job, TokenInfo
from tether.store.protocols import AuthStore

if TYPE_CHECKING:
    from tether.app import App

TOKEN_PREFIX = "tether_"
"""Every token starts with this, so secret scanners and people can recognize one."""
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")


class Role(enum.StrEnum):
    """What a principal may do."""

    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: the token's name, which also owns the jobs it enqueues."""

    name: str
    role: Role

    @property
    def can_write(self) -> bool:
        """Whether this principal may change anything at all."""
        return self.role is not Role.VIEWER

    def sees(self, job: Job) -> bool:
        """Whether this principal may see (and, unless a viewer, act on) ``job``."""
        return self.role is not Role.MEMBER or job.owner == self.name

    @property
    def owner_filter(self) -> str | None:
        """The owner every listing is narrowed to, ``None`` for all."""
        return self.name if self.role is Role.MEMBER else None


ANONYMOUS = Principal("anonymous", Role.ADMIN)
"""Who requests act as on a loopback server while no token exists."""


def new_token() -> str:
    """A fresh token: the prefix and 256 random bits, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The hex SHA-256 the store keeps instead of the token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: str) -> str:
    """A token name: 1-64 letters, digits, ``.``, ``_``, ``@`` or ``-``."""
    if not NAME_PATTERN.match(name):
        raise ConfigError(
            f"invalid token name {name!r}: use 1-64 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_role(role: str) -> Role:
    """The :class:`Role` named ``role``."""
    try:
        return Role(role)
    except ValueError:
        raise ConfigError(f"invalid role {role!r}: use admin, member or viewer") from None


class Tokens:
    """Create, list, revoke and check API tokens of an :class:`~tether.App`'s database."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def _store(self) -> AuthStore:
        return await self.app.store()

    async def create(self, name: str, role: str) -> tuple[str, TokenInfo]:
        """Create a token; returns its text (shown once, never stored) and its record.

        Raises :class:`ConfigError` for a bad name or role, or a name already active.
        """
        check_name(name)
        valid_role = check_role(role)
        token = new_token()
        info = await (await self._store()).create_token(name, valid_role, hash_token(token))
        if info is None:
            raise ConfigError(f"an active token named {name!r} exists; revoke it first")
        return token, info

    async def list(self) -> list[TokenInfo]:
        """Every token, active and revoked, oldest first (no secrets in them)."""
        return await (await self._store()).list_tokens()

    async def revoke(self, name: str) -> bool:
        """Revoke the active token named ``name``; ``False`` if there is none."""
        return await (await self._store()).revoke_token(name)

    async def any_active(self) -> bool:
        """Whether at least one token is active."""
        return any(t.revoked_at is None for t in await self.list())

    async def authenticate(self, token: str) -> Principal | None:
        """The principal ``token`` stands for, or ``None`` if it is unknown or revoked."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 256:
            return None
        digest = hash_token(token)
        info = await (await self._store()).find_token(digest)
        # The lookup matched by hash already; comparing again in constant time keeps that
        # true whatever the database's comparison does (collations, truncation).
        if info is None or not hmac.compare_digest(info.token_hash, digest):
            return None
        return Principal(info.name, Role(info.role))
