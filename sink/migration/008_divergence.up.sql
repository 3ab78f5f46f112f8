-- Divergence: after a failover to a standby that was behind, or a
-- restore, the database can be behind the offsets workers had acknowledged
-- (mirrored to Kafka's committed offsets). A 'diverged' hold records the
-- highest offset acknowledged before; its acknowledgement accepts the
-- database's state, and claims no longer compare against offsets up to it.
ALTER TABLE {{schema}}.partition_holds ADD COLUMN acked_offset bigint;
