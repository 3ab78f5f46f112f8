DROP TABLE {{schema}}.halted_partitions;
