-- A dead letter per job and log epoch. An operator's reset or
-- acknowledgement can move a partition back over a job that was
-- dead-lettered (a new log epoch); the job runs again, and if it fails again
-- it must be parked again, in the fenced transaction that moves past it. With
-- one letter per job, the second could not be written: the lane took that for
-- a dead-lettering whose outcome it had missed, claimed again, and looped
-- on the same job. Within one log epoch a second letter still means exactly
-- that, and is still refused.
ALTER TABLE {{schema}}.dead_letters ADD COLUMN log_epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE {{schema}}.dead_letters DROP CONSTRAINT dead_letters_consumer_group_topic_partition_job_offset_key;
ALTER TABLE {{schema}}.dead_letters ADD CONSTRAINT dead_letters_job_key UNIQUE (consumer_group, topic, partition, job_offset, log_epoch);
