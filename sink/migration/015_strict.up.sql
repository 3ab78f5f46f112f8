-- Strict hand-off (G3-strict, docs/fencing.md "Strict hand-off"): a strict
-- lane ends a batch's transaction with PREPARE TRANSACTION, commits the
-- batch's offset to the group coordinator, and only then COMMIT PREPARED.
--
-- fence_log.gid names the prepared transaction a commit entry belongs to
-- (NULL for the ordinary COMMIT path): the entry is written inside the
-- prepared transaction, so it is visible exactly when the batch committed,
-- whoever committed it (its lane, or the next claim resolving it).
ALTER TABLE {{schema}}.fence_log ADD COLUMN gid text;
CREATE INDEX fence_log_gid_idx ON {{schema}}.fence_log (gid) WHERE gid IS NOT NULL;

-- strict_batches records the decisions on prepared batches that leave no
-- other trace: every rollback, and every decision of a resolver, written
-- just after its ROLLBACK PREPARED or COMMIT PREPARED (best effort: a
-- decider that dies in between leaves it unrecorded; the fence log still
-- says whether the batch committed). A lane's own COMMIT PREPARED is
-- recorded by its fence log entry alone, to spare a round trip per batch. decided_by is 'lane' (the batch's own
-- lane, on the coordinator's answer) or 'resolver' (a later claim of the
-- partition, on the group's committed offset read after its own
-- assignment); evidence says what the decision rested on.
CREATE TABLE {{schema}}.strict_batches (
    gid               text PRIMARY KEY,
    consumer_group    text NOT NULL,
    topic             text NOT NULL,
    partition         integer NOT NULL,
    incarnation       bigint NOT NULL,
    epoch             integer NOT NULL,
    owner             text NOT NULL,
    claim_id          bigint NOT NULL,
    from_offset       bigint NOT NULL,
    to_offset         bigint NOT NULL,
    outcome           text NOT NULL CHECK (outcome IN ('committed', 'rolled-back')),
    decided_by        text NOT NULL CHECK (decided_by IN ('lane', 'resolver')),
    decider           text NOT NULL,
    decider_claim_id  bigint NOT NULL,
    evidence          text NOT NULL,
    decided_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX strict_batches_partition_idx ON {{schema}}.strict_batches (consumer_group, topic, partition);
