-- Listing reads as cached calls (ADR 0046): a page of group summaries, one group's view and
-- the queue figures of a page are each one call of a function, through a statement each
-- connection prepares once: one round trip, no parse. Each function holds the statement (or,
-- for a page, the four forms of it) the code sent unnamed before, unchanged, and plans it on
-- every call with the call's values and the tables as they are then (`plan_cache_mode =
-- force_custom_plan`): no generic plan made while a table was small or empty ever serves it
-- (ADR 0007, 0024, 0042). It caches the parsed statement only.
--
-- JIT compilation is off inside them: a page's statements take a few milliseconds, and on a
-- store whose statistics are stale the planner's cost estimates passed `jit_above_cost`, so
-- Postgres compiled the queue figures' statement on every call (about 30 ms of LLVM work for
-- a statement that runs in 2-4 ms; `docs/benchmarks.md`, "Listing reads as cached calls").
-- Bitmap scans are off too: per group each probe reads a few rows by key, where a bitmap is
-- built and torn down per group.
--
-- The statements are the ones in `projections/src/summary.rs` (`pg_summary_sql`),
-- `projections/src/rows.rs` (`PG_GROUP`) and `queue/src/postgres/stats.rs`
-- (`GROUP_FIGURES_SQL`): the plan tests (`tests/tests/read_plans.rs`) check those texts, and
-- a test checks that each function runs exactly them (whitespace aside). A change to one is a
-- new migration that replaces the function.

-- A summary page: $1 the group name to start after, $2 the row count, $3 the topic (NULL: any),
-- $4 only groups with an open waiter, $5 the catch-up projector, $6 the instance TTL in
-- microseconds. Rows: the store's clock, the log's head and the projector's checkpoint on every
-- row (one row with NULL group columns when the page is empty), then per group its effective
-- row, its open waiters counted up to 101 and the oldest of them, its instances and live ones.
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
SET plan_cache_mode = force_custom_plan
SET jit = off
SET enable_bitmapscan = off
AS $$
BEGIN
    IF $3 IS NULL AND NOT $4 THEN
        RETURN QUERY
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT MAX(position) FROM
        events), 0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE
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
        RETURN QUERY
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT MAX(position) FROM
        events), 0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE
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
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT MAX(position) FROM
        events), 0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE
        projector = $5), 0) AS checkpoint) SELECT m.now, m.head, m.checkpoint, p.group_name,
        p.topic, p.declarer, p.version, p.patterns, p.previous, p.declared_at, p.attempt_at,
        p.position, p.installs, COALESCE(o.waiters, 0), o.declarer, o.version, o.patterns,
        o.incumbent, o.declared_at, o.attempt_at, COALESCE(c.instances, 0), COALESCE(c.live, 0)
        FROM meta m LEFT JOIN LATERAL (SELECT e.group_name, e.topic, e.declarer, e.version,
        e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs FROM ( WITH
        RECURSIVE waiting(name) AS ( (SELECT a.group_name FROM declarer_attempt a WHERE a.status
        = 'waiting' AND a.group_name > $1 ORDER BY a.group_name LIMIT 1) UNION ALL SELECT
        (SELECT a.group_name FROM declarer_attempt a WHERE a.status = 'waiting' AND a.group_name
        > w.name ORDER BY a.group_name LIMIT 1) FROM waiting w WHERE w.name IS NOT NULL) SELECT
        g.* FROM waiting w CROSS JOIN LATERAL ( SELECT g.* FROM effective_declaration g CROSS
        JOIN LATERAL ( SELECT 1 FROM declarer_attempt a WHERE a.group_name = g.group_name AND
        a.status = 'waiting' AND a.patterns <> g.patterns ORDER BY a.declared_at, a.declarer
        LIMIT 1) open WHERE g.group_name = w.name LIMIT 1) g LIMIT $2) e ORDER BY e.group_name)
        p ON true LEFT JOIN LATERAL (SELECT COUNT(*) AS instances, COUNT(*) FILTER ( WHERE
        i.heartbeat_at > m.now - $6::bigint * interval '1 microsecond') AS live FROM
        worker_instance i WHERE i.group_name = p.group_name) c ON true LEFT JOIN LATERAL (SELECT
        w.*, COUNT(*) OVER () AS waiters FROM ( SELECT a.declarer, a.version, a.patterns,
        a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a WHERE a.group_name =
        p.group_name AND a.status = 'waiting' AND a.patterns <> p.patterns ORDER BY
        a.declared_at, a.declarer LIMIT 101) w ORDER BY w.declared_at, w.declarer LIMIT 1) o ON
        true ORDER BY p.group_name;
    ELSE
        RETURN QUERY
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT MAX(position) FROM
        events), 0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE
        projector = $5), 0) AS checkpoint) SELECT m.now, m.head, m.checkpoint, p.group_name,
        p.topic, p.declarer, p.version, p.patterns, p.previous, p.declared_at, p.attempt_at,
        p.position, p.installs, COALESCE(o.waiters, 0), o.declarer, o.version, o.patterns,
        o.incumbent, o.declared_at, o.attempt_at, COALESCE(c.instances, 0), COALESCE(c.live, 0)
        FROM meta m LEFT JOIN LATERAL (SELECT e.group_name, e.topic, e.declarer, e.version,
        e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs FROM ( WITH
        RECURSIVE waiting(name) AS ( (SELECT a.group_name FROM declarer_attempt a WHERE a.status
        = 'waiting' AND a.group_name > $1 ORDER BY a.group_name LIMIT 1) UNION ALL SELECT
        (SELECT a.group_name FROM declarer_attempt a WHERE a.status = 'waiting' AND a.group_name
        > w.name ORDER BY a.group_name LIMIT 1) FROM waiting w WHERE w.name IS NOT NULL) SELECT
        g.* FROM waiting w CROSS JOIN LATERAL ( SELECT g.* FROM effective_declaration g CROSS
        JOIN LATERAL ( SELECT 1 FROM declarer_attempt a WHERE a.group_name = g.group_name AND
        a.status = 'waiting' AND a.patterns <> g.patterns ORDER BY a.declared_at, a.declarer
        LIMIT 1) open WHERE g.group_name = w.name AND g.topic = $3 LIMIT 1) g LIMIT $2) e ORDER
        BY e.group_name) p ON true LEFT JOIN LATERAL (SELECT COUNT(*) AS instances, COUNT(*)
        FILTER ( WHERE i.heartbeat_at > m.now - $6::bigint * interval '1 microsecond') AS live
        FROM worker_instance i WHERE i.group_name = p.group_name) c ON true LEFT JOIN LATERAL
        (SELECT w.*, COUNT(*) OVER () AS waiters FROM ( SELECT a.declarer, a.version,
        a.patterns, a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a WHERE
        a.group_name = p.group_name AND a.status = 'waiting' AND a.patterns <> p.patterns ORDER
        BY a.declared_at, a.declarer LIMIT 101) w ORDER BY w.declared_at, w.declarer LIMIT 1) o
        ON true ORDER BY p.group_name;
    END IF;
END
$$;

-- One group: $1 the group, $2 and $3 the waiter key to start after (NULL: the first), $4 the
-- count of each list, $5 the instance key to start after, $6 the catch-up projector. One row:
-- the clock, the head and the checkpoint, then the group's effective row (NULL when it was
-- never declared) and a page of its waiters and of its instances, each as JSON text.
CREATE OR REPLACE FUNCTION wharf_group_view(
    p_group TEXT,
    p_waiters_at TIMESTAMPTZ,
    p_waiters_declarer TEXT,
    p_count BIGINT,
    p_instances_after TEXT,
    p_projector TEXT
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
    r_waiters TEXT,
    r_instances TEXT
)
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_custom_plan
SET jit = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT MAX(position) FROM events),
    0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE projector = $6), 0)
    AS checkpoint) SELECT m.now, m.head, m.checkpoint, e.group_name, e.topic, e.declarer,
    e.version, e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs,
    (SELECT json_agg(w ORDER BY w.declared_at, w.declarer)::text FROM ( SELECT a.declarer,
    a.version, a.patterns, a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a
    WHERE a.group_name = e.group_name AND a.status = 'waiting' AND a.patterns <> e.patterns AND
    (a.declared_at, a.declarer) > (COALESCE($2::timestamptz, '-infinity'), COALESCE($3::text,
    '')) ORDER BY a.declared_at, a.declarer LIMIT $4) w), (SELECT json_agg(i ORDER BY
    i.declarer)::text FROM ( SELECT w.declarer, w.topic, w.version, w.patterns, w.started_at,
    w.heartbeat_at FROM worker_instance w WHERE w.group_name = e.group_name AND w.declarer > $5
    ORDER BY w.declarer LIMIT $4) i) FROM meta m LEFT JOIN effective_declaration e ON
    e.group_name = $1;
END
$$;

-- The queue figures of the groups $1 names, by name (a group without a queue row is left out).
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
SET plan_cache_mode = force_custom_plan
SET jit = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH clock AS (SELECT clock_timestamp() AS now) SELECT g.group_name, g.topic,
    g.routed_position, COALESCE((SELECT head FROM topic t WHERE t.name = g.topic), 0),
    d.claimable, d.in_flight, d.backing_off, (SELECT COUNT(*) FROM dead_letter x WHERE
    x.group_name = g.group_name), (SELECT m.published_at FROM delivery f JOIN message m ON
    m.topic = f.topic AND m.position = f.position WHERE f.group_name = g.group_name ORDER BY
    f.position LIMIT 1), clock.now, (SELECT COUNT(*) FROM set_aside s WHERE s.group_name =
    g.group_name), GREATEST(g.rescan_until - g.rescan_position + 1, 0) FROM clock CROSS JOIN
    consumer_group g CROSS JOIN LATERAL ( SELECT COUNT(*) FILTER (WHERE e.visible_at <=
    clock.now) AS claimable, COUNT(*) FILTER (WHERE e.visible_at > clock.now AND e.claim_token
    IS NOT NULL) AS in_flight, COUNT(*) FILTER (WHERE e.visible_at > clock.now AND e.claim_token
    IS NULL) AS backing_off FROM delivery e WHERE e.group_name = g.group_name) d WHERE
    g.group_name = ANY($1::text[]) ORDER BY g.group_name;
END
$$;
