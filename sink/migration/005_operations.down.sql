DROP TABLE {{schema}}.fence_log_pruned;
ALTER TABLE {{schema}}.ledger DROP COLUMN job_key_bytes;
ALTER TABLE {{schema}}.exports DROP COLUMN job_value;
