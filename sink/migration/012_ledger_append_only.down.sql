ALTER TABLE {{schema}}.ledger ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
CREATE INDEX ledger_position_idx ON {{schema}}.ledger (topic, partition, job_offset);
ALTER TABLE {{schema}}.ledger ADD COLUMN token text GENERATED ALWAYS AS (incarnation::text || '.' || epoch::text) STORED;
