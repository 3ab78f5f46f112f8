-- Exports to an object store (package sink/export; docs/export.md). The
-- bytes live in the store under immutable names, one per staging (key, job
-- position, token, a nonce); Postgres holds, per export key, the pointer to
-- the visible object. The pointer moves only in the fenced transaction that
-- commits the job's offset, and only forward: to a later job of the same
-- partition (or of another log: another topic, partition or topic id).
CREATE TABLE {{schema}}.export_pointers (
    export_key     text        NOT NULL PRIMARY KEY,
    store          text        NOT NULL,
    object         text        NOT NULL,
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    log_id         uuid,
    job_offset     bigint      NOT NULL,
    incarnation    bigint      NOT NULL,
    epoch          integer     NOT NULL,
    size           bigint      NOT NULL,
    sha256         bytea       NOT NULL,
    worker         text        NOT NULL,
    version        bigint      NOT NULL,
    published_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per job the export sink committed, in the same transaction:
--   moved       the pointer moved to the job's object (version: the
--               pointer's version from then on);
--   superseded  the pointer already showed a later job: the object was
--               staged and stays unpublished (garbage for gc);
--   coalesced   a later job of the same key in the same batch was published
--               instead (no object was staged for this one).
-- collected_at is set when gc deletes the object.
CREATE TABLE {{schema}}.export_publications (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    export_key     text        NOT NULL,
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    job_offset     bigint      NOT NULL,
    incarnation    bigint      NOT NULL,
    epoch          integer     NOT NULL,
    worker         text        NOT NULL,
    store          text,
    object         text,
    size           bigint,
    sha256         bytea,
    outcome        text        NOT NULL CHECK (outcome IN ('moved', 'superseded', 'coalesced')),
    version        bigint,
    committed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    collected_at   timestamptz
);
CREATE INDEX export_publications_object_idx ON {{schema}}.export_publications (object);
CREATE INDEX export_publications_key_idx ON {{schema}}.export_publications (export_key, version);
