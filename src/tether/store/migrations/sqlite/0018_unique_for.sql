-- An idempotency key can be taken for a window only (unique_for): after this time (Unix
-- seconds), an enqueue with the same key lets the old job go of it and creates a new job.
ALTER TABLE tether_jobs ADD COLUMN idempotency_expires_at REAL;
