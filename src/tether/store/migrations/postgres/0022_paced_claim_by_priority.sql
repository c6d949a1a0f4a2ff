-- tether schema, version 22 (PostgreSQL): a claim under rate limits keeps the global
-- order (priority, then run_at, then id), as SQLite's does. Version 20 claimed in fixed
-- groups (rate-limited queues first), so a low-priority job of a limited queue could
-- jump ahead of a high-priority one elsewhere.
--
-- With no rate limit on these queues and tasks (the common case) it is tether_claim
-- itself. Otherwise the buckets involved are locked (FOR UPDATE, in id order, so every
-- claimer spends from the same ones) and refilled by database time; then jobs are taken
-- one at a time, each the best claimable job among the queues and tasks whose buckets
-- still hold a token, spending from its queue's and its task's bucket.
CREATE OR REPLACE FUNCTION tether_claim_paced(p_worker TEXT, p_queues TEXT[], p_tasks TEXT[],
                                              p_limit INTEGER, p_lease DOUBLE PRECISION)
RETURNS SETOF tether_jobs LANGUAGE plpgsql AS $$
DECLARE
    buckets TEXT[];
    have JSONB := '{}';
    b RECORD;
    j tether_jobs;
    taken INTEGER := 0;
    queues TEXT[];
    tasks TEXT[];
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
    WHILE taken < p_limit LOOP
        -- A bucket with less than one token closes its queue or task for this claim.
        queues := ARRAY(SELECT x FROM unnest(p_queues) AS x
                        WHERE coalesce((have ->> ('queue:' || x))::DOUBLE PRECISION, 1) >= 1);
        tasks := ARRAY(SELECT x FROM unnest(p_tasks) AS x
                       WHERE coalesce((have ->> ('task:' || x))::DOUBLE PRECISION, 1) >= 1);
        EXIT WHEN cardinality(queues) = 0 OR cardinality(tasks) = 0;
        SELECT * INTO j FROM tether_claim(p_worker, queues, tasks, 1, p_lease);
        EXIT WHEN j.id IS NULL;
        taken := taken + 1;
        FOREACH k IN ARRAY ARRAY['queue:' || j.queue, 'task:' || j.task] LOOP
            IF have ? k THEN
                have := have || jsonb_build_object(k, (have ->> k)::DOUBLE PRECISION - 1);
            END IF;
        END LOOP;
        RETURN NEXT j;
    END LOOP;
    UPDATE tether_rate_limits r
    SET tokens = greatest(0, (have ->> r.id)::DOUBLE PRECISION), refilled_at = now()
    WHERE r.id IN (SELECT jsonb_object_keys(have));
END
$$;
