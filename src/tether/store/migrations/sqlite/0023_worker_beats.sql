-- tether schema, version 23 (SQLite): liveness by heartbeats that arrive, not by
-- clocks (see the PostgreSQL migration). On SQLite every process reads its own clock,
-- so a process whose clock is ahead saw every lease as expired; the counter is watched
-- on the rescuer's monotonic clock instead.
ALTER TABLE tether_workers ADD COLUMN beats INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tether_workers ADD COLUMN lease REAL;
-- The jobs the worker still holds as of its last counted beat (a JSON array of ids), and
-- when the beat before it landed (see the PostgreSQL migration).
ALTER TABLE tether_workers ADD COLUMN holding TEXT;
ALTER TABLE tether_workers ADD COLUMN beat_before REAL;
-- The worker's own number of its latest counted beat: a beat call the worker gave up on
-- may still land after later ones, and must not write its older `holding` over theirs
-- (a job it holds would then look dropped). An older beat leaves the row alone.
ALTER TABLE tether_workers ADD COLUMN beat_seq INTEGER NOT NULL DEFAULT 0;
