DROP TABLE {{schema}}.job_duplicates;
DROP TABLE {{schema}}.job_ids;
DROP TABLE {{schema}}.effect_records;
