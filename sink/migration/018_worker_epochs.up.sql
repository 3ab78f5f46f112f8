-- The member's epoch as its worker last heard it from the coordinator,
-- written with each heartbeat: the group generation of a classic group,
-- the member epoch of a KIP-848 one. DescribeGroups does not report a
-- classic group's generation, and when every member joined the group fresh
-- their join metadata does not give it away either (a single-member group,
-- usually): `tenure admin assignments` then shows the heartbeat's. NULL:
-- not known (a row written by a worker from before this migration).
ALTER TABLE {{schema}}.workers ADD COLUMN epoch integer;
