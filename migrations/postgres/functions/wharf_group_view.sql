-- One group: $1 the group, $2 and $3 the waiter key to start after (NULL: the first), $4 the
-- count of each list, $5 the instance key to start after, $6 the catch-up projector. One row:
-- the clock, the head and the checkpoint, then the group's effective row (NULL when it was
-- never declared) and a page of its waiters and of its instances, each as JSON text.
-- Kept for builds before migration 0027, which read one group through it (ADR 0065).
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
