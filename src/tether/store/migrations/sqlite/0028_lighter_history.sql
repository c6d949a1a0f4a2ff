-- tether schema, version 28 (SQLite): a job's history as one view on both stores.
--
-- On PostgreSQL this version stops writing the three transitions of a job that simply
-- runs and succeeds (while nothing follows the transitions) and derives them from the
-- job's row in tether_job_history. SQLite keeps writing every transition: its triggers
-- run per row inside the writer's one transaction, where the events of a claimed or
-- finished batch share a few pages, and nothing on SQLite says whether a feed follows.
-- The view gives the listings one query on both stores, with PostgreSQL's ranks: 0 the
-- creation, 3 the success (terminal, so the last), 1 every other transition.
CREATE VIEW tether_job_history AS
SELECT e.id, e.job_id, e.from_state, e.to_state, e.at, e.worker_id, e.actor, e.reason,
       CASE WHEN e.from_state IS NULL THEN 0 WHEN e.to_state = 'succeeded' THEN 3 ELSE 1 END
           AS rank
FROM tether_job_events e;
