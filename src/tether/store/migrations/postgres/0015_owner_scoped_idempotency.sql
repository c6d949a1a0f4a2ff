-- Idempotency keys are scoped by the job's owner: the stored key is
-- owner || chr(31) || key, so one principal's key never meets another's.
-- Ownerless jobs (the Python API's) keep their keys as they are.
UPDATE tether_jobs
SET idempotency_key = owner || chr(31) || idempotency_key
WHERE owner IS NOT NULL
  AND idempotency_key IS NOT NULL
  AND strpos(idempotency_key, chr(31)) = 0;
