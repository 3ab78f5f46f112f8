-- Log epochs: offsets compare only within one log.
--
-- Offsets stored for a partition belong to one log (the topic id says which
-- topic). An operator's acknowledgement can still declare that the offsets
-- start over in a sense the topic id does not show: a log that lost records
-- and reuses their offsets (ahead-of-log), a log whose start passed the
-- stored offset (log-truncated), a database whose state is accepted although
-- it is behind what the group had acknowledged (diverged). Each such
-- acknowledgement starts a new log epoch of the partition. Everything that
-- compares offsets across time compares them within one log epoch:
--   * a commit carries the log epoch of its lane's claim, so a batch begun
--     before an acknowledgement never commits after it;
--   * the offsets mirrored to Kafka carry it (in the commit's metadata), so a
--     mirror of an earlier epoch is never read as a loss of the database's;
--   * an export pointer moves to any job of a later log epoch;
--   * export gc re-reads the epoch before it deletes.
ALTER TABLE {{schema}}.fences ADD COLUMN log_epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE {{schema}}.export_pointers ADD COLUMN log_epoch bigint;
ALTER TABLE {{schema}}.partition_holds ADD COLUMN log_epoch bigint;

-- A partition may have several open holds, one per kind: a hold that waits
-- for an operator never hides another one (a handler bug found before the
-- log was truncated stays listed until it is acknowledged too).
DROP INDEX {{schema}}.partition_holds_open_idx;
CREATE UNIQUE INDEX partition_holds_open_idx ON {{schema}}.partition_holds (consumer_group, topic, partition, kind) WHERE resolved_at IS NULL;
