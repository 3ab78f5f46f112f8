DROP INDEX {{schema}}.partition_holds_open_idx;
-- One open hold per partition again: the newest of each partition's open
-- holds stays open, the others are closed as superseded.
UPDATE {{schema}}.partition_holds h SET resolved_at = now(), resolved_by = 'migrate down', resolution = 'closed by migrate down: one open hold per partition'
WHERE resolved_at IS NULL AND EXISTS (SELECT 1 FROM {{schema}}.partition_holds o
    WHERE o.consumer_group = h.consumer_group AND o.topic = h.topic AND o.partition = h.partition
      AND o.resolved_at IS NULL AND o.id > h.id);
CREATE UNIQUE INDEX partition_holds_open_idx ON {{schema}}.partition_holds (consumer_group, topic, partition) WHERE resolved_at IS NULL;
ALTER TABLE {{schema}}.partition_holds DROP COLUMN log_epoch;
ALTER TABLE {{schema}}.export_pointers DROP COLUMN log_epoch;
ALTER TABLE {{schema}}.fences DROP COLUMN log_epoch;
