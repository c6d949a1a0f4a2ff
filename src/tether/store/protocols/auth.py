"""API tokens and the audit log."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tether.job import AuditEntry, TokenInfo


@runtime_checkable
class AuthStore(Protocol):
    """API tokens (only their hashes) and the audit log of who changed what."""

    async def create_token(self, name: str, role: str, token_hash: str) -> TokenInfo | None:
        """Store a new token's hash; ``None`` if an active token already has this name."""

    async def list_tokens(self) -> list[TokenInfo]:
        """Every token, active and revoked, oldest first."""

    async def revoke_token(self, name: str) -> bool:
        """Revoke the active token with this name; ``False`` if there is none."""

    async def find_token(self, token_hash: str) -> TokenInfo | None:
        """The active token with this hash, or ``None``."""

    async def append_audit(
        self,
        actor: str,
        action: str,
        target: str | None,
        result: str,
        request_id: str | None,
        detail: str | None,
    ) -> AuditEntry:
        """Add one audit row, stamped with database time."""

    async def list_audit(self, limit: int, offset: int) -> list[AuditEntry]:
        """Audit rows, newest first."""
