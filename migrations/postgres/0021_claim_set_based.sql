-- The claim call's acks and its claimed rows one statement each, not one per key (ADR 0054).
--
-- Migration 0019 made every statement in `wharf_claim` a look-up by key so that its plans could
-- be made once per connection: a fetch of 10 with 10 acks ran ten deletes, ten updates and ten
-- message reads, each a PL/pgSQL statement with its own executor start and end. Here:
-- 1. the acks: each ack's row found by its whole primary key and token in a lateral subquery
--    (`OFFSET 0` keeps it from being pulled up into a join, so it stays a look-up per ack) and
--    locked; then one delete by those row addresses (`ctid = ANY`, a TID scan: with
--    sequential scans off no other plan reaches the table, since the statement names no
--    indexed column). The lock keeps each address until the call commits;
-- 2. the group's topic and the pick, as in 0019, the pick returning row addresses of the rows
--    it locked;
-- 3. the picked rows updated by those addresses, each joined to its message by the `message`
--    primary key (a lateral subquery again), in one statement.
-- The lists as `position = ANY(...)` beside the group were tried first: a plan made while
-- `delivery` was tiny kept the group as the only index condition and the list as a filter,
-- and read 15,257 buffers on the grown queue of `tests/tests/queue_plans.rs`.
-- `jit = off`: a disabled plan node is costed at 10^10, far over `jit_above_cost`, and a sort
-- forced that way (an earlier draft's ORDER BY) compiled every call (370 ms).
--
-- What a call does is unchanged: the acks first (deleted while the token still matches), then
-- up to `p_max` deliveries stamped with the install in effect (with a fence, only while that
-- install is the fence), from the claim floor on, visible now, SKIP LOCKED, in position order.
-- Rows: an acked `(position, token)` (every other column NULL), then the claimed messages
-- (`c_acked_token` NULL), in no particular order (the caller sorts them).
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
