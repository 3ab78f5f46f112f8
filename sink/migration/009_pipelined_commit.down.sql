DROP FUNCTION {{schema}}.fence_check(bigint, boolean);
