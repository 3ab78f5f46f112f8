ALTER TABLE {{schema}}.fence_log DROP COLUMN claim_id;
ALTER TABLE {{schema}}.fences DROP COLUMN claim_id;
ALTER TABLE {{schema}}.group_incarnations DROP COLUMN high_epoch;
DELETE FROM {{schema}}.group_incarnations WHERE incarnation = 0;
ALTER TABLE {{schema}}.group_incarnations DROP CONSTRAINT group_incarnations_incarnation_check;
ALTER TABLE {{schema}}.group_incarnations ADD CONSTRAINT group_incarnations_incarnation_check CHECK (incarnation > 0);
