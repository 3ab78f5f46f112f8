-- Tables of tenure's built-in handlers (export, ledger). They live beside the
-- fencing state so that one fenced transaction covers both.

-- export: per key, the current export document and the job that produced it.
-- version counts the writes to the key; export_versions keeps one row per
-- write so that "the visible export never went backwards" can be checked.
CREATE TABLE {{schema}}.exports (
    job_key     text        NOT NULL PRIMARY KEY,
    document    jsonb       NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    job_offset  bigint      NOT NULL,
    incarnation bigint      NOT NULL,
    epoch       integer     NOT NULL,
    worker      text        NOT NULL,
    version     bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{schema}}.export_versions (
    job_key     text        NOT NULL,
    version     bigint      NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    job_offset  bigint      NOT NULL,
    incarnation bigint      NOT NULL,
    epoch       integer     NOT NULL,
    worker      text        NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_key, version)
);

-- ledger: one row per job, deliberately without a unique constraint on the
-- job's position, so that a duplicate shows instead of being rejected.
CREATE TABLE {{schema}}.ledger (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    job_offset   bigint      NOT NULL,
    job_key      text        NOT NULL,
    incarnation  bigint      NOT NULL,
    epoch        integer     NOT NULL,
    token        text        GENERATED ALWAYS AS (incarnation::text || '.' || epoch::text) STORED,
    worker       text        NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ledger_position_idx ON {{schema}}.ledger (topic, partition, job_offset);
