ALTER TABLE {{schema}}.partition_holds DROP COLUMN acked_offset;
