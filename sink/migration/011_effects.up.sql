-- Effects outside Postgres (package sink/effect; docs/export.md).
--
-- effect_records: per operation id, what may have been sent to a destination that
-- cannot check a token (an HTTP API, e-mail, a payment). attempted_* is
-- written in its own transaction just before the handler sends (so it
-- survives a crash: "this may have been sent"); sent_* in the fenced batch
-- transaction once the destination answered (so it commits with the offset,
-- or not at all).
CREATE TABLE {{schema}}.effect_records (
    consumer_group  text        NOT NULL,
    operation       text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL,
    job_offset      bigint      NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    attempted_at    timestamptz,
    attempted_by    text,
    attempted_incarnation bigint,
    attempted_epoch integer,
    sent_at         timestamptz,
    sent_by         text,
    sent_incarnation bigint,
    sent_epoch      integer,
    detail          text,
    PRIMARY KEY (consumer_group, operation)
);

-- job_ids: producer-supplied job ids seen per key (optional deduplication),
-- recorded in the fenced batch transaction; job_duplicates: the repeats that
-- were skipped, in the same transaction.
CREATE TABLE {{schema}}.job_ids (
    consumer_group text        NOT NULL,
    job_key        bytea       NOT NULL,
    job_id         text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    job_offset     bigint      NOT NULL,
    incarnation    bigint      NOT NULL,
    epoch          integer     NOT NULL,
    seen_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, job_key, job_id)
);

CREATE TABLE {{schema}}.job_duplicates (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group text        NOT NULL,
    job_key        bytea       NOT NULL,
    job_id         text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    job_offset     bigint      NOT NULL,
    first_topic    text        NOT NULL,
    first_partition integer    NOT NULL,
    first_offset   bigint      NOT NULL,
    incarnation    bigint      NOT NULL,
    epoch          integer     NOT NULL,
    skipped_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_duplicates_position_idx ON {{schema}}.job_duplicates (topic, partition, job_offset);
