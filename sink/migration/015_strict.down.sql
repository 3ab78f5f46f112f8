DROP TABLE {{schema}}.strict_batches;
DROP INDEX {{schema}}.fence_log_gid_idx;
ALTER TABLE {{schema}}.fence_log DROP COLUMN gid;
