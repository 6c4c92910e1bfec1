-- A consumer's fetch as one call (ADR 0042, 0050, 0054): settles its acks, then claims its next
-- batch. Arguments: the group, how many to claim, the claiming instance, the claim's fresh
-- token, the visibility timeout in seconds, the fence (the install the caller joined, or NULL),
-- and the acks to settle first: positions and tokens, pairwise, of the same group (empty arrays
-- when none). Rows: an acked `(position, token)` (every other column NULL), then the claimed
-- messages (`c_acked_token` NULL), in no particular order (the caller sorts them).
CREATE OR REPLACE FUNCTION wharf_claim(
    p_group TEXT,
    p_max BIGINT,
    p_instance TEXT,
    p_token BIGINT,
    p_visibility DOUBLE PRECISION,
    p_fence BIGINT,
    p_ack_positions BIGINT[],
    p_ack_tokens BIGINT[]
) RETURNS TABLE (
    c_position BIGINT,
    c_attempts INTEGER,
    c_routed_by BIGINT,
    c_topic TEXT,
    c_subject TEXT,
    c_payload BYTEA,
    c_headers TEXT,
    c_published_at TIMESTAMPTZ,
    c_acked_token BIGINT
)
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_material = off
SET jit = off
AS $$
DECLARE
    v_topic TEXT;
    v_rows TID[];
BEGIN
    IF coalesce(array_length(p_ack_positions, 1), 0) > 0 THEN
        -- Each ack's row found by its whole key and token and locked (the lateral subquery
        -- cannot be pulled up, so it stays a look-up by key per ack), then deleted by its row
        -- address, which the lock keeps until this call commits.
        v_rows := ARRAY(
            SELECT r.tid
            FROM unnest(p_ack_positions, p_ack_tokens) AS a(position, token)
            CROSS JOIN LATERAL (
                SELECT d.ctid AS tid FROM delivery d
                WHERE d.group_name = p_group AND d.position = a.position
                  AND d.claim_token = a.token
                OFFSET 0 FOR UPDATE) AS r);
        RETURN QUERY
        DELETE FROM delivery d
        WHERE d.ctid = ANY(v_rows)
        RETURNING d.position, NULL::INTEGER, NULL::BIGINT, NULL::TEXT, NULL::TEXT, NULL::BYTEA,
            NULL::TEXT, NULL::TIMESTAMPTZ, d.claim_token;
    END IF;
    SELECT g.topic INTO v_topic FROM consumer_group g WHERE g.group_name = p_group;
    IF v_topic IS NULL THEN
        RETURN;
    END IF;
    v_rows := ARRAY(
        SELECT x.ctid FROM delivery x
        WHERE x.group_name = p_group AND x.visible_at <= clock_timestamp()
          AND x.position >= (SELECT g.claim_floor FROM consumer_group g
                             WHERE g.group_name = p_group)
          AND x.routed_by = (SELECT e.position FROM effective_declaration e
                             WHERE e.group_name = p_group AND e.topic = v_topic
                               AND (p_fence IS NULL OR e.position = p_fence))
        ORDER BY x.position LIMIT p_max FOR UPDATE SKIP LOCKED);
    IF coalesce(array_length(v_rows, 1), 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE delivery d SET attempts = d.attempts + 1, claimed_by = p_instance,
            claim_token = p_token,
            visible_at = clock_timestamp() + make_interval(secs => p_visibility)
        WHERE d.ctid = ANY(v_rows)
        RETURNING d.position, d.attempts, d.routed_by, d.topic)
    SELECT c.position, c.attempts, c.routed_by, c.topic, m.subject, m.payload, m.headers,
        m.published_at, NULL::BIGINT
    FROM claimed c
    CROSS JOIN LATERAL (
        SELECT m.subject, m.payload, m.headers::TEXT AS headers, m.published_at
        FROM message m WHERE m.topic = c.topic AND m.position = c.position
        OFFSET 0) AS m;
END
$$;
