-- Every declaration attempt bumps its group's version under the group row lock. The attempt's
-- first statement locks the row and reads the snapshot together; when the version it saw in its
-- snapshot is not one below the version it wrote, another attempt committed in between, and the
-- snapshot is read again (ADR 0002's lock order is unchanged).
ALTER TABLE consumer_group ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0;
