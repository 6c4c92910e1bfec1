-- The page of waiting groups walks `waiting_group` (ADR 0060).
--
-- The page of groups with an open waiter skipped through the partial index of waiting attempts
-- one group at a time (a recursive loose index scan, ADR 0044): an index descent per listed
-- group to find the next one, then the group's lookup and its open-waiter probe. At 10k groups
-- and 1M events that made its call three times a plain page's (pgbench, one client: 1.78-1.89
-- ms against 0.57-0.63). `waiting_group` names each group that has a waiting attempt; the
-- attempts' projector keeps it in the transaction that changes `declarer_attempt` (a wait adds
-- its group in the statement that records it; an install's resolution removes the group when
-- it leaves no waiting attempt), and a rebuild writes it from the same fold. The page walks its
-- key from the cursor, a contiguous range like a plain page's walk of `effective_declaration`,
-- and still looks each group up by key with its first open waiter, so the listing stays exact
-- while the attempts' projector catches up behind the inline effective rows.
--
-- Additive (ADR 0017). An older build that applies waits during a rolling upgrade does not
-- add their groups here: such a group is missing from the page of waiting groups until this
-- build applies another of its declarations, or `wharf projections rebuild` runs (`--verify`
-- reports the difference). A row an older build leaves behind is never listed: the open
-- waiter's probe decides.

CREATE TABLE IF NOT EXISTS waiting_group (
    group_name TEXT NOT NULL PRIMARY KEY
);

-- The rows the projection already implies.
INSERT INTO waiting_group (group_name)
SELECT DISTINCT group_name FROM declarer_attempt WHERE status = 'waiting'
ON CONFLICT DO NOTHING;

-- The summary page, as in migration 0022 but for the two forms of the page of waiting groups
-- (`$4` true): the statements `pg_summary_sql` builds, planned once per connection with every
-- path but an index's off.
-- Superseded by functions/wharf_group_summaries.sql (ADR 0073).
