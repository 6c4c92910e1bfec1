-- The queue figures of the groups $1 names, by name (a group without a queue row is left out).
-- The statement is the one `GROUP_FIGURES_SQL` builds.
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
