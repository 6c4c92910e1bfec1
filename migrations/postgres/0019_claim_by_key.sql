-- The claim call planned once per connection, every statement in it by key (ADR 0050).
--
-- `wharf_claim` (migration 0013) planned its one statement on every call: about 0.3 of the
-- 0.8 ms a claim of 10 with 10 acks cost the server. A plan made once was not safe for that
-- statement: made while `delivery` was small, it put the ack keys and the picked positions,
-- lists both, in filters over the group's whole key range (ADR 0042, ADR 0048 option 3).
--
-- The same work is now a few statements, each with only one plan left once sequential scans,
-- bitmap scans, sorts, hash joins, merge joins and materializing are off, whatever the
-- statistics were when the plan was made:
-- 1. each ack a delete by the whole primary key (group, position) with its token, as
--    `wharf_ack`;
-- 2. the group's topic, by the `consumer_group` primary key;
-- 3. the pick: the `delivery` primary key walked in position order from the claim floor, with
--    the floor and the install in effect as look-ups by key in the same statement (so in one
--    snapshot with the pick, as before: a swap that committed before the pick's snapshot
--    governs it). The install is looked up by group and topic, which both of
--    `effective_declaration`'s indexes hold whole: by the group alone, a plan made on a
--    one-row table took the `(topic, group_name)` index and would scan all of it;
-- 4. each picked delivery updated by its primary key, and its message read by the `message`
--    primary key.
--
-- What a call does is unchanged: the acks first (deleted while the token still matches), then
-- up to `p_max` deliveries stamped with the install in effect (with a fence, only while that
-- install is the fence), from the claim floor on, visible now, SKIP LOCKED, in position order.
-- An ack no longer needs excluding from the pick: the pick runs after the deletes and sees
-- them. Rows: an acked `(position, token)` (every other column NULL), then the claimed
-- messages (`c_acked_token` NULL). `tests/tests/queue_plans.rs` holds every call to a few
-- buffers on a queue and a group table that grew after the connection's first call.
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
AS $$
DECLARE
    v_topic TEXT;
    v_picked BIGINT[];
    v_position BIGINT;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ack_positions, 1), 0) LOOP
        DELETE FROM delivery d
        WHERE d.group_name = p_group AND d.position = p_ack_positions[i]
          AND d.claim_token = p_ack_tokens[i];
        IF FOUND THEN
            c_position := p_ack_positions[i];
            c_acked_token := p_ack_tokens[i];
            RETURN NEXT;
        END IF;
    END LOOP;
    c_acked_token := NULL;
    SELECT g.topic INTO v_topic FROM consumer_group g WHERE g.group_name = p_group;
    IF v_topic IS NULL THEN
        RETURN;
    END IF;
    v_picked := ARRAY(
        SELECT x.position FROM delivery x
        WHERE x.group_name = p_group AND x.visible_at <= clock_timestamp()
          AND x.position >= (SELECT g.claim_floor FROM consumer_group g
                             WHERE g.group_name = p_group)
          AND x.routed_by = (SELECT e.position FROM effective_declaration e
                             WHERE e.group_name = p_group AND e.topic = v_topic
                               AND (p_fence IS NULL OR e.position = p_fence))
        ORDER BY x.position LIMIT p_max FOR UPDATE SKIP LOCKED);
    FOREACH v_position IN ARRAY v_picked LOOP
        UPDATE delivery d SET attempts = d.attempts + 1, claimed_by = p_instance,
            claim_token = p_token,
            visible_at = clock_timestamp() + make_interval(secs => p_visibility)
        WHERE d.group_name = p_group AND d.position = v_position
        RETURNING d.topic, d.attempts, d.routed_by INTO c_topic, c_attempts, c_routed_by;
        c_position := v_position;
        SELECT m.subject, m.payload, m.headers::text, m.published_at
        INTO c_subject, c_payload, c_headers, c_published_at
        FROM message m WHERE m.topic = c_topic AND m.position = v_position;
        IF FOUND THEN
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;
