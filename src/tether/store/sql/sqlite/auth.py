"""API tokens and the audit log (see :mod:`tether.store.common.auth`)."""

from tether.store.sql.sqlite.fragments import NOW

# The partial unique index on active names turns a taken name into no row.
CREATE_TOKEN = (
    "INSERT INTO tether_tokens (name, role, token_hash, created_at) "
    f"VALUES (:name, :role, :hash, {NOW}) ON CONFLICT DO NOTHING RETURNING *"
)
LIST_TOKENS = "SELECT * FROM tether_tokens ORDER BY id"
REVOKE_TOKEN = (
    f"UPDATE tether_tokens SET revoked_at = {NOW} WHERE name = :name AND revoked_at IS NULL"
)
FIND_TOKEN = "SELECT * FROM tether_tokens WHERE token_hash = :hash AND revoked_at IS NULL"
APPEND_AUDIT = (
    "INSERT INTO tether_audit (at, actor, action, target, result, request_id, detail) "
    f"VALUES ({NOW}, :actor, :action, :target, :result, :request_id, :detail) RETURNING *"
)
LIST_AUDIT = "SELECT * FROM tether_audit ORDER BY id DESC LIMIT :limit OFFSET :offset"
