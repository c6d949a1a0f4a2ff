-- tether schema, version 21 (SQLite): the dead-worker check reads only live workers,
-- not every worker row ever seen.
CREATE INDEX tether_workers_state ON tether_workers (state, host);
