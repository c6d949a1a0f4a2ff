-- tether schema, version 20 (PostgreSQL): workers record the tasks they serve (a JSON
-- array; NULL for a worker that predates this, taken to serve every task), so a job that
-- no live worker can run says so; and rate limits per queue or task, one token bucket
-- per row ('queue:<name>' or 'task:<name>'), refilled and spent inside the claim.
ALTER TABLE tether_workers ADD COLUMN tasks TEXT;

CREATE TABLE tether_rate_limits (
    id          TEXT PRIMARY KEY,
    per_second  DOUBLE PRECISION NOT NULL CHECK (per_second > 0),
    burst       INTEGER NOT NULL CHECK (burst >= 1),
    tokens      DOUBLE PRECISION NOT NULL CHECK (tokens >= 0),
    refilled_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Claim as tether_claim does, spending rate-limit tokens. With no rate limit on these
-- queues and tasks (the common case) it is tether_claim itself. Otherwise the buckets
-- involved are locked (FOR UPDATE, in id order, so every claimer spends from the same
-- ones), refilled by database time, and the claim is split into groups that each spend
-- from fixed buckets: for each rate-limited queue its unlimited tasks and each limited
-- task, then the unlimited queues' limited tasks, and last the unlimited rest, each
-- group taking at most what its buckets hold.
CREATE FUNCTION tether_claim_paced(p_worker TEXT, p_queues TEXT[], p_tasks TEXT[],
                                   p_limit INTEGER, p_lease DOUBLE PRECISION)
RETURNS SETOF tether_jobs LANGUAGE plpgsql AS $$
DECLARE
    buckets TEXT[];
    have JSONB := '{}';
    b RECORD;
    g RECORD;
    room INTEGER;
    got INTEGER;
    taken INTEGER := 0;
    spent JSONB := '{}';
    k TEXT;
BEGIN
    buckets := ARRAY(SELECT 'queue:' || x FROM unnest(p_queues) AS x)
            || ARRAY(SELECT 'task:' || x FROM unnest(p_tasks) AS x);
    FOR b IN SELECT id, least(burst, tokens + greatest(0, extract(epoch FROM now() - refilled_at))
                                          * per_second) AS n
             FROM tether_rate_limits WHERE id = ANY(buckets) ORDER BY id FOR UPDATE
    LOOP
        have := have || jsonb_build_object(b.id, b.n);
    END LOOP;
    IF have = '{}' THEN
        RETURN QUERY SELECT * FROM tether_claim(p_worker, p_queues, p_tasks, p_limit, p_lease);
        RETURN;
    END IF;
    FOR g IN
        WITH qs AS (SELECT x AS q, have ? ('queue:' || x) AS rated FROM unnest(p_queues) AS x),
             ts AS (SELECT x AS t, have ? ('task:' || x) AS rated FROM unnest(p_tasks) AS x),
             free_q AS (SELECT array_agg(q) AS a FROM qs WHERE NOT rated),
             free_t AS (SELECT array_agg(t) AS a FROM ts WHERE NOT rated)
        SELECT 1 AS ord, ARRAY[qs.q] AS queues, free_t.a AS tasks,
               ARRAY['queue:' || qs.q] AS keys
        FROM qs, free_t WHERE qs.rated AND free_t.a IS NOT NULL
        UNION ALL
        SELECT 1, ARRAY[qs.q], ARRAY[ts.t], ARRAY['queue:' || qs.q, 'task:' || ts.t]
        FROM qs, ts WHERE qs.rated AND ts.rated
        UNION ALL
        SELECT 2, free_q.a, ARRAY[ts.t], ARRAY['task:' || ts.t]
        FROM free_q, ts WHERE free_q.a IS NOT NULL AND ts.rated
        UNION ALL
        SELECT 3, free_q.a, free_t.a, ARRAY[]::TEXT[]
        FROM free_q, free_t WHERE free_q.a IS NOT NULL AND free_t.a IS NOT NULL
        ORDER BY 1
    LOOP
        room := p_limit - taken;
        FOREACH k IN ARRAY g.keys LOOP
            room := least(room, floor((have ->> k)::DOUBLE PRECISION
                                      - coalesce((spent ->> k)::INTEGER, 0))::INTEGER);
        END LOOP;
        CONTINUE WHEN room < 1;
        RETURN QUERY SELECT * FROM tether_claim(p_worker, g.queues, g.tasks, room, p_lease);
        GET DIAGNOSTICS got = ROW_COUNT;
        taken := taken + got;
        FOREACH k IN ARRAY g.keys LOOP
            spent := spent || jsonb_build_object(k, coalesce((spent ->> k)::INTEGER, 0) + got);
        END LOOP;
    END LOOP;
    UPDATE tether_rate_limits r
    SET tokens = greatest(0, (tokens_now.n)), refilled_at = now()
    FROM (SELECT key AS id, (value::TEXT)::DOUBLE PRECISION
                 - coalesce((spent ->> key)::INTEGER, 0) AS n
          FROM jsonb_each(have)) AS tokens_now
    WHERE r.id = tokens_now.id AND spent ? tokens_now.id;
END
$$;
