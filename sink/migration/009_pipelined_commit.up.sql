-- The fence statement sent together with COMMIT (one round trip): it must
-- fail, not merely update nothing, when it does not pass, so that the COMMIT
-- behind it finds the transaction aborted and commits nothing. The marker
-- check (the handler must not have ended the batch's transaction itself)
-- travels in the same statement.
CREATE FUNCTION {{schema}}.fence_check(updated bigint, marker_ok boolean) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT marker_ok THEN
        RAISE EXCEPTION USING ERRCODE = 'TF002',
            MESSAGE = 'tenure: the batch transaction was ended before the fence (its handler ran COMMIT or ROLLBACK)';
    END IF;
    IF updated <> 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'TF001', MESSAGE = 'tenure: fenced';
    END IF;
    RETURN updated;
END
$$;
