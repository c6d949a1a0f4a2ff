-- tether schema, version 4 (PostgreSQL): API tokens and the audit log.

-- Tokens are stored only as the SHA-256 of a high-entropy secret. A revoked token keeps
-- its row (the audit log names it); a name is unique among the tokens still active, so a
-- revoked name can be issued again (rotation).
CREATE TABLE tether_tokens (
    id         BIGSERIAL PRIMARY KEY,
    name       TEXT NOT NULL,
    role       TEXT NOT NULL CHECK (role IN ('admin', 'member', 'viewer')),
    token_hash TEXT NOT NULL UNIQUE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at TIMESTAMPTZ
);
CREATE UNIQUE INDEX tether_tokens_active_name ON tether_tokens (name) WHERE revoked_at IS NULL;

-- One row per mutation and per denied attempt, stamped with database time.
CREATE TABLE tether_audit (
    id         BIGSERIAL PRIMARY KEY,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor      TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT,
    result     TEXT NOT NULL,
    request_id TEXT,
    detail     TEXT
);

