"""API tokens and the audit log (:class:`~tether.store.protocols.AuthStore`)."""

from __future__ import annotations

from tether.job import AuditEntry, TokenInfo
from tether.store.common.base import SqlBase
from tether.store.driver import Tx


class AuthSql(SqlBase):
    """API tokens (only their hashes) and the audit log of who changed what."""

    async def create_token(self, name: str, role: str, token_hash: str) -> TokenInfo | None:
        async def body(tx: Tx) -> TokenInfo | None:
            params = {"name": name, "role": role, "hash": token_hash}
            row = await tx.one(self.sql.auth.CREATE_TOKEN, params)
            return self._api.token(row) if row else None

        return await self._change(body)

    async def list_tokens(self) -> list[TokenInfo]:
        async def body(tx: Tx) -> list[TokenInfo]:
            return [self._api.token(r) for r in await tx.all(self.sql.auth.LIST_TOKENS)]

        return await self._query(body)

    async def revoke_token(self, name: str) -> bool:
        async def body(tx: Tx) -> bool:
            return await tx.run(self.sql.auth.REVOKE_TOKEN, {"name": name}) > 0

        return await self._change(body)

    async def find_token(self, token_hash: str) -> TokenInfo | None:
        async def body(tx: Tx) -> TokenInfo | None:
            row = await tx.one(self.sql.auth.FIND_TOKEN, {"hash": token_hash})
            return self._api.token(row) if row else None

        return await self._query(body)

    async def append_audit(
        self,
        actor: str,
        action: str,
        target: str | None,
        result: str,
        request_id: str | None,
        detail: str | None,
    ) -> AuditEntry:
        params = {
            "actor": actor,
            "action": action,
            "target": target,
            "result": result,
            "request_id": request_id,
            "detail": detail,
        }

        async def body(tx: Tx) -> AuditEntry:
            row = await tx.one(self.sql.auth.APPEND_AUDIT, params)
            assert row is not None
            return self._api.audit(row)

        return await self._change(body)

    async def list_audit(self, limit: int, offset: int) -> list[AuditEntry]:
        async def body(tx: Tx) -> list[AuditEntry]:
            rows = await tx.all(self.sql.auth.LIST_AUDIT, {"limit": limit, "offset": offset})
            return [self._api.audit(r) for r in rows]

        return await self._query(body)
