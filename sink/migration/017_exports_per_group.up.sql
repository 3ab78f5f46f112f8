-- The export handler's table (without --export-store; migration 002) kept
-- one row per job key: two groups, or two topics, writing the same key
-- shared it, and each write replaced the other's. A row is now one per
-- (consumer group, topic, key): a group's latest export of a key of a
-- topic. The group is part of the key because the fence is per group: two
-- groups consuming the same topic each have their own row, which only
-- that group's fence guards, so a group that lags never moves the other's
-- export back (docs/handlers.md, "The export handler's table").
--
-- Rows written before this migration did not record their group: it is
-- the only group with a fencing row for the row's partition, else, of the
-- groups with one, the one whose fence log holds the commit that wrote the
-- row (same token, the job's offset in the committed range), else '' (the
-- group cannot be told; the row is kept as it is). No row is lost: the new
-- key is finer than the old. (coalesce reads the fence log only for the
-- partitions that several groups consume, through its per-group index.)
ALTER TABLE {{schema}}.exports ADD COLUMN consumer_group text;
ALTER TABLE {{schema}}.export_versions ADD COLUMN consumer_group text;

UPDATE {{schema}}.exports e SET consumer_group = coalesce(
    (SELECT min(f.consumer_group) FROM {{schema}}.fences f
     WHERE f.topic = e.topic AND f.partition = e.partition HAVING count(*) = 1),
    (SELECT l.consumer_group FROM {{schema}}.fences f
     JOIN {{schema}}.fence_log l ON l.consumer_group = f.consumer_group AND l.topic = f.topic AND l.partition = f.partition
     WHERE f.topic = e.topic AND f.partition = e.partition
       AND l.kind = 'commit' AND l.incarnation = e.incarnation AND l.epoch = e.epoch
       AND l.from_offset <= e.job_offset AND e.job_offset < l.to_offset
     ORDER BY l.id DESC LIMIT 1),
    '');
UPDATE {{schema}}.export_versions v SET consumer_group = coalesce(
    (SELECT min(f.consumer_group) FROM {{schema}}.fences f
     WHERE f.topic = v.topic AND f.partition = v.partition HAVING count(*) = 1),
    (SELECT l.consumer_group FROM {{schema}}.fences f
     JOIN {{schema}}.fence_log l ON l.consumer_group = f.consumer_group AND l.topic = f.topic AND l.partition = f.partition
     WHERE f.topic = v.topic AND f.partition = v.partition
       AND l.kind = 'commit' AND l.incarnation = v.incarnation AND l.epoch = v.epoch
       AND l.from_offset <= v.job_offset AND v.job_offset < l.to_offset
     ORDER BY l.id DESC LIMIT 1),
    '');

ALTER TABLE {{schema}}.exports ALTER COLUMN consumer_group SET NOT NULL;
ALTER TABLE {{schema}}.export_versions ALTER COLUMN consumer_group SET NOT NULL;
ALTER TABLE {{schema}}.exports DROP CONSTRAINT exports_pkey;
ALTER TABLE {{schema}}.exports ADD PRIMARY KEY (consumer_group, topic, job_key);
ALTER TABLE {{schema}}.export_versions DROP CONSTRAINT export_versions_pkey;
ALTER TABLE {{schema}}.export_versions ADD PRIMARY KEY (consumer_group, topic, job_key, version);
