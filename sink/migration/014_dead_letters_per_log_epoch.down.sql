-- One letter per job again: the newest of each job's letters stays.
DELETE FROM {{schema}}.dead_letter_actions a USING {{schema}}.dead_letters d
WHERE a.dead_letter_id = d.id AND EXISTS (SELECT 1 FROM {{schema}}.dead_letters n
    WHERE n.consumer_group = d.consumer_group AND n.topic = d.topic AND n.partition = d.partition
      AND n.job_offset = d.job_offset AND n.id > d.id);
DELETE FROM {{schema}}.dead_letters d WHERE EXISTS (SELECT 1 FROM {{schema}}.dead_letters n
    WHERE n.consumer_group = d.consumer_group AND n.topic = d.topic AND n.partition = d.partition
      AND n.job_offset = d.job_offset AND n.id > d.id);
ALTER TABLE {{schema}}.dead_letters DROP CONSTRAINT dead_letters_job_key;
ALTER TABLE {{schema}}.dead_letters ADD CONSTRAINT dead_letters_consumer_group_topic_partition_job_offset_key UNIQUE (consumer_group, topic, partition, job_offset);
ALTER TABLE {{schema}}.dead_letters DROP COLUMN log_epoch;
