-- One group's read as rows (ADR 0065), with `wharf_group_view`'s arguments: first one row of
-- kind 0 (the clock, the log's head, the projector's checkpoint, and the group's effective row,
-- its columns NULL when the group was never declared), then one row of kind 1 per waiter in
-- (declared_at, declarer) order, then one row of kind 2 per instance in declarer order, each
-- list at most `$4` rows. The statement is the one `PG_GROUP_ROWS` builds.
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
