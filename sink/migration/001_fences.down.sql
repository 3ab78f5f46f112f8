DROP TABLE {{schema}}.fence_log;
DROP TABLE {{schema}}.fences;
