-- The application's own table. A row per order, written by the handler in
-- the same transaction that moves the partition's offset: it exists
-- exactly once per job, whatever the workers went through.
CREATE TABLE IF NOT EXISTS {{schema}}.orders (
    job         text        PRIMARY KEY,   -- consumer.JobID: topic/partition/offset
    customer    text        NOT NULL,      -- the Kafka key: one customer, one owner at a time
    amount      numeric     NOT NULL,
    token       text        NOT NULL,      -- the fencing token it was written under
    written_at  timestamptz NOT NULL DEFAULT now()
);
