-- Fast hand-off: a new owner that waits on a lock held by an older
-- claimant of its partition ends that session. Batch transactions name their
-- claim in application_name ('tenure:<claim id>'); this index finds the
-- partition a claim id belongs to.
CREATE INDEX fence_log_claim_idx ON {{schema}}.fence_log (claim_id) WHERE kind = 'claim';
