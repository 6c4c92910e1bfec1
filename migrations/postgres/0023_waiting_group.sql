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
CREATE OR REPLACE FUNCTION wharf_group_summaries(
    p_after TEXT,
    p_fetch BIGINT,
    p_topic TEXT,
    p_waiting BOOLEAN,
    p_projector TEXT,
    p_ttl_micros BIGINT
) RETURNS TABLE (
    r_now TIMESTAMPTZ,
    r_head BIGINT,
    r_checkpoint BIGINT,
    r_group TEXT,
    r_topic TEXT,
    r_declarer TEXT,
    r_version TEXT,
    r_patterns TEXT[],
    r_previous TEXT[],
    r_declared_at TIMESTAMPTZ,
    r_attempt_at TIMESTAMPTZ,
    r_position BIGINT,
    r_installs BIGINT,
    r_waiters BIGINT,
    r_oldest_declarer TEXT,
    r_oldest_version TEXT,
    r_oldest_patterns TEXT[],
    r_oldest_incumbent TEXT[],
    r_oldest_declared_at TIMESTAMPTZ,
    r_oldest_attempt_at TIMESTAMPTZ,
    r_instances BIGINT,
    r_live BIGINT
)
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_material = off
SET jit = off
SET enable_bitmapscan = off
AS $$
BEGIN
    IF $3 IS NULL AND NOT $4 THEN
        RETURN QUERY        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
    events ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE
        projector = $5), 0) AS checkpoint) SELECT m.now, m.head, m.checkpoint, p.group_name,
        p.topic, p.declarer, p.version, p.patterns, p.previous, p.declared_at, p.attempt_at,
        p.position, p.installs, COALESCE(o.waiters, 0), o.declarer, o.version, o.patterns,
        o.incumbent, o.declared_at, o.attempt_at, COALESCE(c.instances, 0), COALESCE(c.live, 0)
        FROM meta m LEFT JOIN LATERAL (SELECT e.group_name, e.topic, e.declarer, e.version,
        e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs FROM
        effective_declaration e WHERE e.group_name > $1 ORDER BY e.group_name LIMIT $2) p ON
        true LEFT JOIN LATERAL (SELECT COUNT(*) AS instances, COUNT(*) FILTER ( WHERE
        i.heartbeat_at > m.now - $6::bigint * interval '1 microsecond') AS live FROM
        worker_instance i WHERE i.group_name = p.group_name) c ON true LEFT JOIN LATERAL (SELECT
        w.*, COUNT(*) OVER () AS waiters FROM ( SELECT a.declarer, a.version, a.patterns,
        a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a WHERE a.group_name =
        p.group_name AND a.status = 'waiting' AND a.patterns <> p.patterns ORDER BY
        a.declared_at, a.declarer LIMIT 101) w ORDER BY w.declared_at, w.declarer LIMIT 1) o ON
        true ORDER BY p.group_name;
    ELSIF NOT $4 THEN
        RETURN QUERY        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
    events ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE
        projector = $5), 0) AS checkpoint) SELECT m.now, m.head, m.checkpoint, p.group_name,
        p.topic, p.declarer, p.version, p.patterns, p.previous, p.declared_at, p.attempt_at,
        p.position, p.installs, COALESCE(o.waiters, 0), o.declarer, o.version, o.patterns,
        o.incumbent, o.declared_at, o.attempt_at, COALESCE(c.instances, 0), COALESCE(c.live, 0)
        FROM meta m LEFT JOIN LATERAL (SELECT e.group_name, e.topic, e.declarer, e.version,
        e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs FROM
        effective_declaration e WHERE e.group_name > $1 AND e.topic = $3 ORDER BY e.group_name
        LIMIT $2) p ON true LEFT JOIN LATERAL (SELECT COUNT(*) AS instances, COUNT(*) FILTER (
        WHERE i.heartbeat_at > m.now - $6::bigint * interval '1 microsecond') AS live FROM
        worker_instance i WHERE i.group_name = p.group_name) c ON true LEFT JOIN LATERAL (SELECT
        w.*, COUNT(*) OVER () AS waiters FROM ( SELECT a.declarer, a.version, a.patterns,
        a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a WHERE a.group_name =
        p.group_name AND a.status = 'waiting' AND a.patterns <> p.patterns ORDER BY
        a.declared_at, a.declarer LIMIT 101) w ORDER BY w.declared_at, w.declarer LIMIT 1) o ON
        true ORDER BY p.group_name;
    ELSIF $3 IS NULL THEN
        RETURN QUERY
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
        events ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position
        FROM projection_checkpoint WHERE projector = $5), 0) AS checkpoint) SELECT
        m.now, m.head, m.checkpoint, p.group_name, p.topic, p.declarer, p.version,
        p.patterns, p.previous, p.declared_at, p.attempt_at, p.position, p.installs,
        COALESCE(o.waiters, 0), o.declarer, o.version, o.patterns, o.incumbent,
        o.declared_at, o.attempt_at, COALESCE(c.instances, 0), COALESCE(c.live, 0) FROM
        meta m LEFT JOIN LATERAL (SELECT e.group_name, e.topic, e.declarer, e.version,
        e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs FROM
        ( SELECT g.* FROM waiting_group w CROSS JOIN LATERAL ( SELECT g.* FROM ( SELECT
        * FROM effective_declaration g WHERE g.group_name >= w.group_name ORDER BY
        g.group_name LIMIT 1) g CROSS JOIN LATERAL (SELECT 1 FROM declarer_attempt a
        WHERE a.group_name = g.group_name AND a.status = 'waiting' AND a.patterns <>
        g.patterns ORDER BY a.declared_at, a.declarer LIMIT 1) open WHERE g.group_name =
        w.group_name LIMIT 1) g WHERE w.group_name > $1 ORDER BY w.group_name LIMIT $2)
        e ORDER BY e.group_name) p ON true LEFT JOIN LATERAL (SELECT COUNT(*) AS
        instances, COUNT(*) FILTER ( WHERE i.heartbeat_at > m.now - $6::bigint *
        interval '1 microsecond') AS live FROM worker_instance i WHERE i.group_name =
        p.group_name) c ON true LEFT JOIN LATERAL (SELECT w.*, COUNT(*) OVER () AS
        waiters FROM ( SELECT a.declarer, a.version, a.patterns, a.incumbent,
        a.declared_at, a.attempt_at FROM declarer_attempt a WHERE a.group_name =
        p.group_name AND a.status = 'waiting' AND a.patterns <> p.patterns ORDER BY
        a.declared_at, a.declarer LIMIT 101) w ORDER BY w.declared_at, w.declarer LIMIT
        1) o ON true ORDER BY p.group_name;
    ELSE
        RETURN QUERY
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
        events ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position
        FROM projection_checkpoint WHERE projector = $5), 0) AS checkpoint) SELECT
        m.now, m.head, m.checkpoint, p.group_name, p.topic, p.declarer, p.version,
        p.patterns, p.previous, p.declared_at, p.attempt_at, p.position, p.installs,
        COALESCE(o.waiters, 0), o.declarer, o.version, o.patterns, o.incumbent,
        o.declared_at, o.attempt_at, COALESCE(c.instances, 0), COALESCE(c.live, 0) FROM
        meta m LEFT JOIN LATERAL (SELECT e.group_name, e.topic, e.declarer, e.version,
        e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs FROM
        ( SELECT g.* FROM waiting_group w CROSS JOIN LATERAL ( SELECT g.* FROM ( SELECT
        * FROM effective_declaration g WHERE g.group_name >= w.group_name ORDER BY
        g.group_name LIMIT 1) g CROSS JOIN LATERAL (SELECT 1 FROM declarer_attempt a
        WHERE a.group_name = g.group_name AND a.status = 'waiting' AND a.patterns <>
        g.patterns ORDER BY a.declared_at, a.declarer LIMIT 1) open WHERE g.group_name =
        w.group_name AND g.topic = $3 LIMIT 1) g WHERE w.group_name > $1 ORDER BY
        w.group_name LIMIT $2) e ORDER BY e.group_name) p ON true LEFT JOIN LATERAL
        (SELECT COUNT(*) AS instances, COUNT(*) FILTER ( WHERE i.heartbeat_at > m.now -
        $6::bigint * interval '1 microsecond') AS live FROM worker_instance i WHERE
        i.group_name = p.group_name) c ON true LEFT JOIN LATERAL (SELECT w.*, COUNT(*)
        OVER () AS waiters FROM ( SELECT a.declarer, a.version, a.patterns, a.incumbent,
        a.declared_at, a.attempt_at FROM declarer_attempt a WHERE a.group_name =
        p.group_name AND a.status = 'waiting' AND a.patterns <> p.patterns ORDER BY
        a.declared_at, a.declarer LIMIT 101) w ORDER BY w.declared_at, w.declarer LIMIT
        1) o ON true ORDER BY p.group_name;
    END IF;
END
$$;
