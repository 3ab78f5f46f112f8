-- Group lifetimes. Epochs restart when a group is deleted or
-- expires, and a reset can reject nothing (a partition without a fencing row,
-- or stored epochs below the new lifetime's), so it is detected on
-- registration instead: before the coordinator confirms a claimant's epoch,
-- the claimant registers it here, under the incarnation it read. A claimant
-- whose confirmed epoch is below the registered high epoch of its
-- incarnation knows the epochs went backwards and moves the incarnation on.
-- See docs/fencing.md, "Group lifetimes".
ALTER TABLE {{schema}}.group_incarnations DROP CONSTRAINT group_incarnations_incarnation_check;
ALTER TABLE {{schema}}.group_incarnations ADD CONSTRAINT group_incarnations_incarnation_check CHECK (incarnation >= 0);
ALTER TABLE {{schema}}.group_incarnations ADD COLUMN high_epoch integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN {{schema}}.group_incarnations.high_epoch IS
    'the highest epoch registered under this incarnation; reset to 0 by a bump';

-- The claimant: one value per lane (one assignment of a partition to one
-- member). A claim at the very token already stored is accepted only from
-- the same claimant (a retried claim), and commits must come from it: two
-- lanes never share a claim, even if they share a member id and an epoch.
ALTER TABLE {{schema}}.fences ADD COLUMN claim_id bigint NOT NULL DEFAULT 0;
ALTER TABLE {{schema}}.fence_log ADD COLUMN claim_id bigint NOT NULL DEFAULT 0;
