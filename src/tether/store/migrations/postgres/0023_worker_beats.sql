-- tether schema, version 23 (PostgreSQL): liveness by heartbeats that arrive, not by
-- clocks. Every heartbeat that reaches a worker's row adds one to `beats` and records
-- the lease it grants (`lease`, seconds). The rescuer watches the counter on its own
-- monotonic clock: a job whose lease expired is rescued only once the rescuer has seen
-- its worker's counter stand still for at least that lease, so a step of the server's
-- clock cannot rescue a worker whose heartbeats still arrive.
ALTER TABLE tether_workers ADD COLUMN beats BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tether_workers ADD COLUMN lease DOUBLE PRECISION;
-- The jobs the worker still holds, as of its last counted beat (running, or being
-- finished or stopped; NULL when a claim was out, so that the list may be short), and
-- when the beat before it landed. A running job of a live worker missing from the list
-- and older than the beat before was dropped by its worker (it fenced itself, say): its
-- lease decides.
ALTER TABLE tether_workers ADD COLUMN holding BIGINT[];
ALTER TABLE tether_workers ADD COLUMN beat_before TIMESTAMPTZ;
-- The worker's own number of its latest counted beat: a beat call the worker gave up on
-- may still land after later ones, and must not write its older `holding` over theirs
-- (a job it holds would then look dropped). An older beat leaves the row alone.
ALTER TABLE tether_workers ADD COLUMN beat_seq BIGINT NOT NULL DEFAULT 0;
