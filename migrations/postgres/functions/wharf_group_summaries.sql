-- A summary page: $1 the group name to start after, $2 the row count, $3 the topic (NULL: any),
-- $4 only groups with an open waiter, $5 the catch-up projector, $6 the instance TTL in
-- microseconds. Rows: the store's clock, the log's head and the projector's checkpoint on every
-- row (one row with NULL group columns when the page is empty), then per group its effective
-- row, its open waiters counted up to 101 and the oldest of them, its instances and live ones.
-- The statements are those `pg_summary_sql` builds.
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
