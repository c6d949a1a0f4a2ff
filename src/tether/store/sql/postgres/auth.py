"""API tokens and the audit log (see :mod:`tether.store.common.auth`)."""

# The partial unique index on active names turns a taken name into no row.
CREATE_TOKEN = (
    "INSERT INTO tether_tokens (name, role, token_hash) VALUES (%(name)s, %(role)s, %(hash)s) "
    "ON CONFLICT DO NOTHING RETURNING *"
)
LIST_TOKENS = "SELECT * FROM tether_tokens ORDER BY id"
REVOKE_TOKEN = (
    "UPDATE tether_tokens SET revoked_at = now() WHERE name = %(name)s AND revoked_at IS NULL"
)
FIND_TOKEN = "SELECT * FROM tether_tokens WHERE token_hash = %(hash)s AND revoked_at IS NULL"
APPEND_AUDIT = (
    "INSERT INTO tether_audit (actor, action, target, result, request_id, detail) "
    "VALUES (%(actor)s, %(action)s, %(target)s, %(result)s, %(request_id)s, %(detail)s) "
    "RETURNING *"
)
LIST_AUDIT = "SELECT * FROM tether_audit ORDER BY id DESC LIMIT %(limit)s OFFSET %(offset)s"
