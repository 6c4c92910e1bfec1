-- The listing's keyed lookups end at their key, and no listing call memoizes (ADR 0070).
--
-- A page of waiting groups looked each group up as the first name from the one sought, then
-- checked it equal (migration 0024), and one group's read did the same (migration 0027): the
-- form that keeps the primary key in a plan made on empty tables (ADR 0058), where an equality
-- on the name makes the order moot and ties with a walk of the whole `(topic, group_name)`
-- index. But a scan bounded below only reads the rest of its leaf page before the `LIMIT`
-- takes the first row: about 2.5 us a group, a quarter of the page's server time (pgbench, one
-- client, 10k groups and 1M events: the page of waiting groups 1.27-1.33 ms a call as it was,
-- 1.00-1.10 with the range closed). Each lookup now takes the names from the one sought up to
-- the same one, in name order: still only the primary key gives that order (a plan made on
-- empty tables analyzed empty keeps it), and the scan ends at the key.
--
-- Memoize is turned off in the three listing calls as every other path but an index's is:
-- each lateral probe of a page is for a different group, so its cache only missed (101 misses
-- a page, hashing each group's patterns), 0.05-0.1 ms a page.
--
-- The queue figures walk a group's deliveries once: the aggregate that counts them also takes
-- their first position, whose message is the oldest unacked one (a group consumes one topic
-- for good, so its deliveries' topic is the group's). A second walk of the deliveries to find
-- the first one was about a tenth of the call (0.97-0.98 ms a page of 100 groups, 0.84-0.88
-- with one walk).
--
-- The statements are those `pg_summary_sql`, `PG_GROUP_ROWS` and `GROUP_FIGURES_SQL` build
-- (`tests/tests/listing_calls.rs` checks all three). Written to run twice.

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
SET enable_memoize = off
AS $$
BEGIN
    IF $3 IS NULL AND NOT $4 THEN
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
        effective_declaration e WHERE e.group_name > $1 ORDER BY e.group_name LIMIT $2)
        p ON true LEFT JOIN LATERAL (SELECT COUNT(*) AS instances, COUNT(*) FILTER (
        WHERE i.heartbeat_at > m.now - $6::bigint * interval '1 microsecond') AS live
        FROM worker_instance i WHERE i.group_name = p.group_name) c ON true LEFT JOIN
        LATERAL (SELECT w.*, COUNT(*) OVER () AS waiters FROM ( SELECT a.declarer,
        a.version, a.patterns, a.incumbent, a.declared_at, a.attempt_at FROM
        declarer_attempt a WHERE a.group_name = p.group_name AND a.status = 'waiting'
        AND a.patterns <> p.patterns ORDER BY a.declared_at, a.declarer LIMIT 101) w
        ORDER BY w.declared_at, w.declarer LIMIT 1) o ON true ORDER BY p.group_name;
    ELSIF NOT $4 THEN
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
        effective_declaration e WHERE e.group_name > $1 AND e.topic = $3 ORDER BY
        e.group_name LIMIT $2) p ON true LEFT JOIN LATERAL (SELECT COUNT(*) AS
        instances, COUNT(*) FILTER ( WHERE i.heartbeat_at > m.now - $6::bigint *
        interval '1 microsecond') AS live FROM worker_instance i WHERE i.group_name =
        p.group_name) c ON true LEFT JOIN LATERAL (SELECT w.*, COUNT(*) OVER () AS
        waiters FROM ( SELECT a.declarer, a.version, a.patterns, a.incumbent,
        a.declared_at, a.attempt_at FROM declarer_attempt a WHERE a.group_name =
        p.group_name AND a.status = 'waiting' AND a.patterns <> p.patterns ORDER BY
        a.declared_at, a.declarer LIMIT 101) w ORDER BY w.declared_at, w.declarer LIMIT
        1) o ON true ORDER BY p.group_name;
    ELSIF $3 IS NULL THEN
        RETURN QUERY
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
        events ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position
        FROM projection_checkpoint WHERE projector = $5), 0) AS checkpoint) SELECT
        m.now, m.head, m.checkpoint, p.group_name, p.topic, p.declarer, p.version,
        p.patterns, p.previous, p.declared_at, p.attempt_at, p.position, p.installs,
        COALESCE(p.waiters, 0), p.oldest_declarer, p.oldest_version, p.oldest_patterns,
        p.oldest_incumbent, p.oldest_declared_at, p.oldest_attempt_at,
        COALESCE(c.instances, 0), COALESCE(c.live, 0) FROM meta m LEFT JOIN LATERAL
        (SELECT e.group_name, e.topic, e.declarer, e.version, e.patterns, e.previous,
        e.declared_at, e.attempt_at, e.position, e.installs, e.waiters,
        e.oldest_declarer, e.oldest_version, e.oldest_patterns, e.oldest_incumbent,
        e.oldest_declared_at, e.oldest_attempt_at FROM ( SELECT g.*, o.waiters,
        o.declarer AS oldest_declarer, o.version AS oldest_version, o.patterns AS
        oldest_patterns, o.incumbent AS oldest_incumbent, o.declared_at AS
        oldest_declared_at, o.attempt_at AS oldest_attempt_at FROM waiting_group wg
        CROSS JOIN LATERAL ( SELECT * FROM effective_declaration g WHERE g.group_name >=
        wg.group_name AND g.group_name <= wg.group_name ORDER BY g.group_name LIMIT 1) g
        CROSS JOIN LATERAL (SELECT w.*, COUNT(*) OVER () AS waiters FROM ( SELECT
        a.declarer, a.version, a.patterns, a.incumbent, a.declared_at, a.attempt_at FROM
        declarer_attempt a WHERE a.group_name = g.group_name AND a.status = 'waiting'
        AND a.patterns <> g.patterns ORDER BY a.declared_at, a.declarer LIMIT 101) w
        ORDER BY w.declared_at, w.declarer LIMIT 1) o WHERE wg.group_name > $1 ORDER BY
        wg.group_name LIMIT $2) e ORDER BY e.group_name) p ON true LEFT JOIN LATERAL
        (SELECT COUNT(*) AS instances, COUNT(*) FILTER ( WHERE i.heartbeat_at > m.now -
        $6::bigint * interval '1 microsecond') AS live FROM worker_instance i WHERE
        i.group_name = p.group_name) c ON true ORDER BY p.group_name;
    ELSE
        RETURN QUERY
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
        events ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position
        FROM projection_checkpoint WHERE projector = $5), 0) AS checkpoint) SELECT
        m.now, m.head, m.checkpoint, p.group_name, p.topic, p.declarer, p.version,
        p.patterns, p.previous, p.declared_at, p.attempt_at, p.position, p.installs,
        COALESCE(p.waiters, 0), p.oldest_declarer, p.oldest_version, p.oldest_patterns,
        p.oldest_incumbent, p.oldest_declared_at, p.oldest_attempt_at,
        COALESCE(c.instances, 0), COALESCE(c.live, 0) FROM meta m LEFT JOIN LATERAL
        (SELECT e.group_name, e.topic, e.declarer, e.version, e.patterns, e.previous,
        e.declared_at, e.attempt_at, e.position, e.installs, e.waiters,
        e.oldest_declarer, e.oldest_version, e.oldest_patterns, e.oldest_incumbent,
        e.oldest_declared_at, e.oldest_attempt_at FROM ( SELECT g.*, o.waiters,
        o.declarer AS oldest_declarer, o.version AS oldest_version, o.patterns AS
        oldest_patterns, o.incumbent AS oldest_incumbent, o.declared_at AS
        oldest_declared_at, o.attempt_at AS oldest_attempt_at FROM waiting_group wg
        CROSS JOIN LATERAL ( SELECT * FROM effective_declaration g WHERE g.group_name >=
        wg.group_name AND g.group_name <= wg.group_name AND g.topic = $3 ORDER BY
        g.group_name LIMIT 1) g CROSS JOIN LATERAL (SELECT w.*, COUNT(*) OVER () AS
        waiters FROM ( SELECT a.declarer, a.version, a.patterns, a.incumbent,
        a.declared_at, a.attempt_at FROM declarer_attempt a WHERE a.group_name =
        g.group_name AND a.status = 'waiting' AND a.patterns <> g.patterns ORDER BY
        a.declared_at, a.declarer LIMIT 101) w ORDER BY w.declared_at, w.declarer LIMIT
        1) o WHERE wg.group_name > $1 ORDER BY wg.group_name LIMIT $2) e ORDER BY
        e.group_name) p ON true LEFT JOIN LATERAL (SELECT COUNT(*) AS instances,
        COUNT(*) FILTER ( WHERE i.heartbeat_at > m.now - $6::bigint * interval '1
        microsecond') AS live FROM worker_instance i WHERE i.group_name = p.group_name)
        c ON true ORDER BY p.group_name;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION wharf_group_rows(
    p_group TEXT,
    p_waiters_at TIMESTAMPTZ,
    p_waiters_declarer TEXT,
    p_count BIGINT,
    p_instances_after TEXT,
    p_projector TEXT
) RETURNS TABLE (
    r_kind SMALLINT,
    r_now TIMESTAMPTZ,
    r_head BIGINT,
    r_checkpoint BIGINT,
    r_group TEXT,
    r_declarer TEXT,
    r_topic TEXT,
    r_version TEXT,
    r_patterns TEXT[],
    r_previous TEXT[],
    r_incumbent TEXT[],
    r_declared_at TIMESTAMPTZ,
    r_attempt_at TIMESTAMPTZ,
    r_position BIGINT,
    r_installs BIGINT,
    r_started_at TIMESTAMPTZ,
    r_heartbeat_at TIMESTAMPTZ
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
SET enable_memoize = off
SET max_parallel_workers_per_gather = 0
AS $$
BEGIN
    RETURN QUERY
    WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM events
    ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position FROM
    projection_checkpoint WHERE projector = $6), 0) AS checkpoint), e AS (SELECT * FROM
    effective_declaration g WHERE g.group_name >= $1 AND g.group_name <= $1 ORDER BY
    g.group_name LIMIT 1) SELECT 0::smallint, m.now, m.head, m.checkpoint, e.group_name,
    e.declarer, e.topic, e.version, e.patterns, e.previous, NULL::text[], e.declared_at,
    e.attempt_at, e.position, e.installs, NULL::timestamptz, NULL::timestamptz FROM meta m
    LEFT JOIN e ON true UNION ALL SELECT 1::smallint, NULL, NULL, NULL, NULL, a.declarer,
    NULL, a.version, a.patterns, NULL, a.incumbent, a.declared_at, a.attempt_at, NULL, NULL,
    NULL, NULL FROM e CROSS JOIN LATERAL ( SELECT a.declarer, a.version, a.patterns,
    a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a WHERE a.group_name =
    e.group_name AND a.status = 'waiting' AND a.patterns <> e.patterns AND (a.declared_at,
    a.declarer) > (COALESCE($2::timestamptz, '-infinity'), COALESCE($3::text, '')) ORDER BY
    a.declared_at, a.declarer LIMIT $4) a UNION ALL SELECT 2::smallint, NULL, NULL, NULL,
    NULL, i.declarer, i.topic, i.version, i.patterns, NULL, NULL, NULL, NULL, NULL, NULL,
    i.started_at, i.heartbeat_at FROM e CROSS JOIN LATERAL ( SELECT w.declarer, w.topic,
    w.version, w.patterns, w.started_at, w.heartbeat_at FROM worker_instance w WHERE
    w.group_name = e.group_name AND w.declarer > $5 ORDER BY w.declarer LIMIT $4) i;
END
$$;

CREATE OR REPLACE FUNCTION wharf_group_figures(p_groups TEXT[]) RETURNS TABLE (
    r_group TEXT,
    r_topic TEXT,
    r_routed_position BIGINT,
    r_head BIGINT,
    r_claimable BIGINT,
    r_in_flight BIGINT,
    r_backing_off BIGINT,
    r_dead_letters BIGINT,
    r_oldest_published_at TIMESTAMPTZ,
    r_now TIMESTAMPTZ,
    r_set_aside BIGINT,
    r_rescan_remaining BIGINT
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
SET enable_memoize = off
AS $$
BEGIN
    RETURN QUERY
    WITH clock AS (SELECT clock_timestamp() AS now) SELECT g.group_name, g.topic,
    g.routed_position, COALESCE((SELECT head FROM topic t WHERE t.name = g.topic), 0),
    d.claimable, d.in_flight, d.backing_off, (SELECT COUNT(*) FROM dead_letter x WHERE
    x.group_name = g.group_name), (SELECT n.published_at FROM message n WHERE n.topic =
    g.topic AND n.position = d.first_position), clock.now, (SELECT COUNT(*) FROM set_aside s
    WHERE s.group_name = g.group_name), GREATEST(g.rescan_until - g.rescan_position + 1, 0)
    FROM clock CROSS JOIN consumer_group g CROSS JOIN LATERAL ( SELECT COUNT(*) FILTER
    (WHERE e.visible_at <= clock.now) AS claimable, COUNT(*) FILTER (WHERE e.visible_at >
    clock.now AND e.claim_token IS NOT NULL) AS in_flight, COUNT(*) FILTER (WHERE
    e.visible_at > clock.now AND e.claim_token IS NULL) AS backing_off, MIN(e.position) AS
    first_position FROM delivery e WHERE e.group_name = g.group_name) d WHERE g.group_name =
    ANY($1::text[]) ORDER BY g.group_name;
END
$$;
