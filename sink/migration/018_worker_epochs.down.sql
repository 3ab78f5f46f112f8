ALTER TABLE {{schema}}.workers DROP COLUMN epoch;
