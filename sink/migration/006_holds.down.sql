DELETE FROM {{schema}}.fence_log WHERE kind = 'reset';
ALTER TABLE {{schema}}.fence_log DROP CONSTRAINT fence_log_kind_check;
ALTER TABLE {{schema}}.fence_log ADD CONSTRAINT fence_log_kind_check CHECK (kind IN ('claim', 'commit'));
ALTER TABLE {{schema}}.fences DROP COLUMN topic_id;
DROP TABLE {{schema}}.partition_holds;
