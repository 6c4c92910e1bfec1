-- The listing calls planned once per connection, every statement in them by key (ADR 0058).
--
-- Migration 0015 (ADR 0046) made `wharf_group_summaries`, `wharf_group_view` and
-- `wharf_group_figures` plan their statements on every call (`force_custom_plan`), so that no
-- plan made while a table was small or empty would ever serve them. Planning was then a third
-- of a page's server work (pgbench, one client, 10k groups and 1M events: a summary page 0.97
-- ms a call, 0.57-0.72 planned once; the page of waiting groups 2.0-2.3 against 1.4-1.7; one
-- group 0.82-0.88 against 0.52-0.56; a page's queue figures 1.05-1.14 against 0.81-0.85).
--
-- Here each keeps one plan per connection (`force_generic_plan`), made with every other path
-- than an index off: sequential and bitmap scans, sorts, hash and merge joins, materializing,
-- as `wharf_claim` does since migration 0019 (ADR 0050). Every table each statement reads is
-- reached through an index on its key (the group name, a topic's name, the projector, the log
-- position), and with those paths off the plan's shape no longer follows the statistics: a
-- plan made on empty tables is the plan made on a large store. A sort stays where a statement
-- needs one (the page of waiting groups orders its few rows by name), costed as disabled;
-- `jit = off` keeps such a cost from compiling the statement.
--
-- The statements are unchanged, the texts `tests/tests/listing_calls.rs` checks against the
-- code (`pg_summary_sql`, `PG_GROUP`, `GROUP_FIGURES_SQL`); that test makes each connection's
-- plans on empty tables analyzed empty, fills a 20k-group store and holds every call to its
-- bound of buffers. Only the settings differ from 0015.

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
        RETURN QUERY
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
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
        RETURN QUERY
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
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
    events ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE
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
        g.* FROM waiting w CROSS JOIN LATERAL ( SELECT g.* FROM ( SELECT * FROM effective_declaration g WHERE g.group_name >=
        w.name ORDER BY g.group_name LIMIT 1) g CROSS JOIN LATERAL ( SELECT 1 FROM declarer_attempt a WHERE a.group_name = g.group_name AND
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
        WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
    events ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE
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
        g.* FROM waiting w CROSS JOIN LATERAL ( SELECT g.* FROM ( SELECT * FROM effective_declaration g WHERE g.group_name >=
        w.name ORDER BY g.group_name LIMIT 1) g CROSS JOIN LATERAL ( SELECT 1 FROM declarer_attempt a WHERE a.group_name = g.group_name AND
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
    RETURN QUERY
    WITH meta AS (SELECT clock_timestamp() AS now, COALESCE((SELECT position FROM
    events ORDER BY position DESC LIMIT 1), 0) AS head, COALESCE((SELECT position FROM projection_checkpoint WHERE projector = $6), 0)
    AS checkpoint) SELECT m.now, m.head, m.checkpoint, e.group_name, e.topic, e.declarer,
    e.version, e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs,
    (SELECT json_agg(w ORDER BY w.declared_at, w.declarer)::text FROM ( SELECT a.declarer,
    a.version, a.patterns, a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a
    WHERE a.group_name = e.group_name AND a.status = 'waiting' AND a.patterns <> e.patterns AND
    (a.declared_at, a.declarer) > (COALESCE($2::timestamptz, '-infinity'), COALESCE($3::text,
    '')) ORDER BY a.declared_at, a.declarer LIMIT $4) w), (SELECT json_agg(i ORDER BY
    i.declarer)::text FROM ( SELECT w.declarer, w.topic, w.version, w.patterns, w.started_at,
    w.heartbeat_at FROM worker_instance w WHERE w.group_name = e.group_name AND w.declarer > $5
    ORDER BY w.declarer LIMIT $4) i) FROM meta m LEFT JOIN LATERAL (SELECT g.* FROM ( SELECT * FROM
    effective_declaration g WHERE g.group_name >= $1 ORDER BY g.group_name LIMIT 1) g WHERE
    g.group_name = $1) e ON true;
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
    RETURN QUERY
    WITH clock AS (SELECT clock_timestamp() AS now) SELECT g.group_name, g.topic,
    g.routed_position, COALESCE((SELECT head FROM topic t WHERE t.name = g.topic), 0),
    d.claimable, d.in_flight, d.backing_off, (SELECT COUNT(*) FROM dead_letter x WHERE
    x.group_name = g.group_name), (SELECT m.published_at FROM delivery f CROSS JOIN LATERAL (
    SELECT n.published_at FROM message n WHERE n.topic = f.topic AND n.position = f.position
    OFFSET 0) m WHERE f.group_name = g.group_name ORDER BY f.position LIMIT 1), clock.now, (SELECT COUNT(*) FROM set_aside s WHERE s.group_name =
    g.group_name), GREATEST(g.rescan_until - g.rescan_position + 1, 0) FROM clock CROSS JOIN
    consumer_group g CROSS JOIN LATERAL ( SELECT COUNT(*) FILTER (WHERE e.visible_at <=
    clock.now) AS claimable, COUNT(*) FILTER (WHERE e.visible_at > clock.now AND e.claim_token
    IS NOT NULL) AS in_flight, COUNT(*) FILTER (WHERE e.visible_at > clock.now AND e.claim_token
    IS NULL) AS backing_off FROM delivery e WHERE e.group_name = g.group_name) d WHERE
    g.group_name = ANY($1::text[]) ORDER BY g.group_name;
END
$$;
