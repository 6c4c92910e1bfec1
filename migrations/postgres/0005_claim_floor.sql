-- The lowest position a claim needs to look at for a group (ADR 0009). Invariant: no delivery
-- row of the group lies below it. Routing raises it to the group's lowest delivery, under the
-- group row lock; a dead-letter replay lowers it, under the same lock, before it commits.
-- Claims start their index scan here, so the index entries of acked deliveries that VACUUM has
-- not removed yet are not walked by every claim.
ALTER TABLE consumer_group ADD COLUMN IF NOT EXISTS claim_floor BIGINT NOT NULL DEFAULT 0;
