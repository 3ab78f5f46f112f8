-- The fencing state: one row per (consumer group, topic, partition).
-- The token is (incarnation, epoch), compared as a row value; owner is the
-- group member id that claimed the partition at that token.
CREATE TABLE {{schema}}.fences (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL CHECK (partition >= 0),
    incarnation     bigint      NOT NULL CHECK (incarnation >= 0),
    epoch           integer     NOT NULL,
    owner           text        NOT NULL,
    next_offset     bigint      NOT NULL CHECK (next_offset >= 0),
    partition_count integer     NOT NULL CHECK (partition_count > 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    committed_at    timestamptz,
    PRIMARY KEY (consumer_group, topic, partition)
);

-- Every accepted claim and commit, written by the same statement that passed
-- the fence, so the history cannot disagree with the state. Rejections are
-- not here (their transaction rolled back); workers log them.
CREATE TABLE {{schema}}.fence_log (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind           text        NOT NULL CHECK (kind IN ('claim', 'commit')),
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    incarnation    bigint      NOT NULL,
    epoch          integer     NOT NULL,
    owner          text        NOT NULL,
    from_offset    bigint      NOT NULL,
    to_offset      bigint      NOT NULL,
    at             timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX fence_log_partition_idx ON {{schema}}.fence_log (consumer_group, topic, partition, id);
