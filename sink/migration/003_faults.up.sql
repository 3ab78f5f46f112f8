-- Incarnations: the leading component of every token of a group. Bumped by a
-- compare-and-set only when the coordinator confirms that a claimant's epoch
-- is current although a higher epoch is stored: the group's epochs restarted
-- (the group was deleted, or expired while empty).
CREATE TABLE {{schema}}.group_incarnations (
    consumer_group text        NOT NULL PRIMARY KEY,
    incarnation    bigint      NOT NULL CHECK (incarnation > 0),
    bumped_at      timestamptz NOT NULL DEFAULT now(),
    bumped_by      text        NOT NULL,
    reason         text        NOT NULL
);

-- The partition count each group first saw for each topic. Adding partitions
-- remaps keys; workers refuse a topic whose count differs until an operator
-- acknowledges the new count.
CREATE TABLE {{schema}}.topic_layouts (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    partition_count integer     NOT NULL CHECK (partition_count > 0),
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    acknowledged_at timestamptz,
    acknowledged_by text,
    PRIMARY KEY (consumer_group, topic)
);

-- Jobs that failed for good, written in the same fenced transaction that
-- moves the partition past them: neither lost nor processed twice.
CREATE TABLE {{schema}}.dead_letters (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    job_offset     bigint      NOT NULL,
    job_key        bytea,
    job_value      bytea,
    headers        jsonb       NOT NULL DEFAULT '[]',
    error          text        NOT NULL,
    attempts       integer     NOT NULL,
    incarnation    bigint      NOT NULL,
    epoch          integer     NOT NULL,
    owner          text        NOT NULL,
    dead_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    status         text        NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'replayed', 'discarded')),
    UNIQUE (consumer_group, topic, partition, job_offset)
);
CREATE INDEX dead_letters_status_idx ON {{schema}}.dead_letters (consumer_group, status, id);

-- Every replay or discard of a dead letter, who did it, and where a replayed
-- job went.
CREATE TABLE {{schema}}.dead_letter_actions (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dead_letter_id bigint      NOT NULL REFERENCES {{schema}}.dead_letters (id),
    action         text        NOT NULL CHECK (action IN ('replay', 'discard')),
    topic          text,
    partition      integer,
    job_offset     bigint,
    actor          text        NOT NULL,
    at             timestamptz NOT NULL DEFAULT clock_timestamp()
);
