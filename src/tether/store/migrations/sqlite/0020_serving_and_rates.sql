-- tether schema, version 20 (SQLite): workers record the tasks they serve (a JSON array;
-- NULL for a worker that predates this, taken to serve every task), so a job that no
-- live worker can run says so; and rate limits per queue or task, one token bucket per
-- row ('queue:<name>' or 'task:<name>'), refilled and spent inside the claim.
ALTER TABLE tether_workers ADD COLUMN tasks TEXT;

CREATE TABLE tether_rate_limits (
    id          TEXT PRIMARY KEY,
    per_second  REAL NOT NULL CHECK (per_second > 0),
    burst       INTEGER NOT NULL CHECK (burst >= 1),
    tokens      REAL NOT NULL CHECK (tokens >= 0),
    refilled_at REAL NOT NULL
);
