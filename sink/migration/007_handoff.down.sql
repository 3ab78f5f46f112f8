DROP INDEX {{schema}}.fence_log_claim_idx;
