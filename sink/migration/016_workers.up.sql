-- Worker heartbeats: one row per running member of a consumer group,
-- written every couple of seconds by the worker itself (Store.Heartbeat).
-- The group coordinator keeps a member that stopped (SIGKILL, a frozen VM)
-- for its whole session timeout, and the fencing row says only when the
-- partition last moved: a row whose seen_at stops advancing tells
-- `tenure admin assignments`, the ownership page and the workers' group
-- watch that the member is gone well before the coordinator says so.
-- seen_at is the database's clock, compared with the database's clock: the
-- workers' clocks do not matter. A worker that stops gracefully deletes
-- its row; rows not seen for a day are deleted by the group's workers.
CREATE TABLE {{schema}}.workers (
    consumer_group text        NOT NULL,
    member_id      text        NOT NULL,
    client_id      text        NOT NULL,
    host           text        NOT NULL,
    pid            integer     NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    seen_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, member_id)
);
