-- Idempotency keys are scoped by the job's owner: the stored key is
-- owner || char(31) || key, so one principal's key never meets another's.
-- Ownerless jobs (the Python API's) keep their keys as they are.
UPDATE tether_jobs
SET idempotency_key = owner || char(31) || idempotency_key
WHERE owner IS NOT NULL
  AND idempotency_key IS NOT NULL
  AND instr(idempotency_key, char(31)) = 0;
