-- The exact bytes of each job, which the text and jsonb columns cannot keep
-- (a value that is not UTF-8 came back as U+FFFD; jsonb also rewrites JSON
-- and refuses \u0000). document stays: a JSON view for people and queries.
ALTER TABLE {{schema}}.exports ADD COLUMN job_value bytea;
ALTER TABLE {{schema}}.ledger ADD COLUMN job_key_bytes bytea;

-- What pruning removed from the front of each partition's fence log (see
-- Store.PruneFenceLog), so that the log that is left can still be checked:
-- every entry with id <= through_id is gone except the claim that held the
-- partition at the cut (kept_claim_id, NULL if none); the log resumes at
-- next_offset (the last pruned entry's to_offset); no pruned entry carried
-- a token above (max_incarnation, max_epoch).
CREATE TABLE {{schema}}.fence_log_pruned (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL,
    through_id      bigint      NOT NULL,
    kept_claim_id   bigint,
    next_offset     bigint      NOT NULL,
    max_incarnation bigint      NOT NULL,
    max_epoch       integer     NOT NULL,
    pruned          bigint      NOT NULL,
    pruned_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);
