-- Back to one row per job key. Where several rows share a key (two groups,
-- or two topics), the one updated last is kept, as if its write had
-- replaced the others (which is what the old key did), and the other rows
-- are deleted with their export_versions rows; a key held by one row loses
-- nothing.
DELETE FROM {{schema}}.exports e
WHERE EXISTS (
    SELECT 1 FROM {{schema}}.exports o
    WHERE o.job_key = e.job_key
      AND (o.updated_at, o.consumer_group, o.topic) > (e.updated_at, e.consumer_group, e.topic));
DELETE FROM {{schema}}.export_versions v
WHERE NOT EXISTS (
    SELECT 1 FROM {{schema}}.exports e
    WHERE e.job_key = v.job_key AND e.consumer_group = v.consumer_group AND e.topic = v.topic)
  AND EXISTS (
    SELECT 1 FROM {{schema}}.export_versions o
    WHERE o.job_key = v.job_key AND (o.consumer_group, o.topic) <> (v.consumer_group, v.topic));

ALTER TABLE {{schema}}.export_versions DROP CONSTRAINT export_versions_pkey;
ALTER TABLE {{schema}}.export_versions ADD PRIMARY KEY (job_key, version);
ALTER TABLE {{schema}}.exports DROP CONSTRAINT exports_pkey;
ALTER TABLE {{schema}}.exports ADD PRIMARY KEY (job_key);
ALTER TABLE {{schema}}.export_versions DROP COLUMN consumer_group;
ALTER TABLE {{schema}}.exports DROP COLUMN consumer_group;
