-- Partition holds: a partition workers do not process, and why, so
-- that `tenure admin assignments` and `tenure admin holds` can say so and an
-- operator can act. A stall clears itself (the worker is recovering on its
-- own); the other kinds wait for an operator's acknowledgement (`tenure admin
-- holds acknowledge`), recorded here with the actor and what was done. Every
-- lane reads the open hold of its partition before it processes anything, so
-- a hold follows the partition to whichever worker is assigned it.
CREATE TABLE {{schema}}.partition_holds (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    kind           text        NOT NULL CHECK (kind IN ('stalled', 'handler-bug', 'topic-recreated', 'log-truncated', 'ahead-of-log', 'diverged')),
    reason         text        NOT NULL,
    needs_ack      boolean     NOT NULL,
    -- The offsets at stake, as the worker saw them (NULL: unknown).
    next_offset    bigint,
    log_start      bigint,
    high_watermark bigint,
    topic_id       uuid,
    -- handler-bug: the batch whose handler ended its own transaction, and
    -- the token it ran under.
    from_offset    bigint,
    to_offset      bigint,
    first_job      text,
    last_job       text,
    incarnation    bigint,
    epoch          integer,
    owner          text        NOT NULL,
    since          timestamptz NOT NULL DEFAULT clock_timestamp(),
    resolved_at    timestamptz,
    resolved_by    text,
    resolution     text
);
CREATE UNIQUE INDEX partition_holds_open_idx ON {{schema}}.partition_holds (consumer_group, topic, partition) WHERE resolved_at IS NULL;

-- The log's identity: the topic id the stored offsets belong to. A topic
-- deleted and re-created under the same name gets another id.
ALTER TABLE {{schema}}.fences ADD COLUMN topic_id uuid;

-- An operator's acknowledgement of a hold can move the next offset to where
-- the log now is (it went away, or was truncated): a 'reset' entry, so that
-- the history says where the offsets jumped and why.
ALTER TABLE {{schema}}.fence_log DROP CONSTRAINT fence_log_kind_check;
ALTER TABLE {{schema}}.fence_log ADD CONSTRAINT fence_log_kind_check CHECK (kind IN ('claim', 'commit', 'reset'));
