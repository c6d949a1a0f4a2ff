-- tether schema, version 21 (SQLite): the rescue reads only running jobs whose lease
-- expired or whose worker is dead, and the dead-worker check only live workers.
CREATE INDEX tether_jobs_lease ON tether_jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX tether_workers_state ON tether_workers (state, host);
