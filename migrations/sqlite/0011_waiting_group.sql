-- The groups that have a waiting attempt (ADR 0060; see the Postgres twin, migration 0023).
-- Kept by the attempts' projector in the transaction that changes `declarer_attempt`, so the
-- page of waiting groups walks this table's key, a contiguous range like a plain page, rather
-- than skipping through the partial index of waiting attempts one group at a time. Additive.
CREATE TABLE IF NOT EXISTS waiting_group (
    group_name TEXT NOT NULL PRIMARY KEY
) WITHOUT ROWID;

-- The rows the projection already implies.
INSERT OR IGNORE INTO waiting_group (group_name)
SELECT DISTINCT group_name FROM declarer_attempt WHERE status = 'waiting';
