-- tether schema, version 6 (SQLite): workers look for partial cancellations whose jobs
-- have since stopped, to complete their records; few records are partial.
CREATE INDEX tether_cancellations_partial ON tether_cancellations (initiated_at DESC, id)
    WHERE status = 'partial';
