-- The claim as one call (ADR 0042): a consumer's fetch settles its acks and claims its next
-- batch with `SELECT ... FROM wharf_claim(...)`, a statement the connection has prepared once:
-- one round trip. The statement inside was sent unnamed before, so that no generic plan chosen
-- while `delivery` was small could stay cached as it grew (ADR 0007); that cost a parse and a
-- round trip more on every call (Parse/Describe, then Bind/Execute).
--
-- The function keeps what the unnamed statement guaranteed: `plan_cache_mode =
-- force_custom_plan` plans the statement on every call with the call's values and the table as
-- it is then; what it caches per connection is the parsed and analyzed statement only. It also
-- plans with sequential scans, bitmap scans and sorts disabled, so the pick always walks the
-- `delivery` primary key in position order from the claim floor and stops after its batch,
-- even on statistics taken while the table was nearly empty (the unnamed statement, planned on
-- such statistics at 300k rows, read the whole table and sorted it: tests/tests/queue_plans.rs).
-- These settings are in effect only while the function runs.
--
-- Arguments: the group, how many to claim, the claiming instance, the claim's fresh token, the
-- visibility timeout in seconds, the fence (the install the caller joined, or NULL), and the
-- acks to settle first: positions and tokens, pairwise, of the same group (empty arrays when
-- none). Rows: a claimed message (`c_acked_token` NULL), or an acked `(position, token)`
-- (every other column NULL).
--
-- The statement is the one `queue/src/postgres/claim.rs` sent before, unchanged, and still one
-- statement, so one snapshot for the acks, the floor, the install and the pick: acks first
-- (deleted when the token still matches), then the pick, SKIP LOCKED, of deliveries stamped
-- with the install in effect (with a fence, only while that install is the fence), from the
-- claim floor on, visible now and not among the positions just acked (no row is both deleted
-- and updated by the one statement). The floor and the install are scalar subqueries by
-- primary key, each run once; the row lock re-checks `routed_by` on a row re-stamped after the
-- statement's snapshot.
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
SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    WITH acked AS (
        DELETE FROM delivery d
        USING unnest(p_ack_positions, p_ack_tokens) AS s(position, token)
        WHERE d.group_name = p_group AND d.position = s.position AND d.claim_token = s.token
        RETURNING d.position, d.claim_token
    ), claimed AS (
        UPDATE delivery d SET attempts = d.attempts + 1, claimed_by = p_instance,
            claim_token = p_token,
            visible_at = clock_timestamp() + make_interval(secs => p_visibility)
        WHERE d.group_name = p_group AND d.position = ANY(ARRAY(
            SELECT x.position FROM delivery x
            WHERE x.group_name = p_group AND x.visible_at <= clock_timestamp()
              AND x.position >= (SELECT g.claim_floor FROM consumer_group g
                                 WHERE g.group_name = p_group)
              AND x.routed_by = (SELECT e.position FROM effective_declaration e
                                 WHERE e.group_name = p_group
                                   AND (p_fence IS NULL OR e.position = p_fence))
              AND x.position <> ALL(p_ack_positions)
            ORDER BY x.position LIMIT p_max FOR UPDATE SKIP LOCKED))
        RETURNING d.topic, d.position, d.attempts, d.routed_by
    )
    SELECT c.position, c.attempts, c.routed_by, c.topic, m.subject, m.payload,
           m.headers::text, m.published_at, NULL::bigint
    FROM claimed c JOIN message m ON m.topic = c.topic AND m.position = c.position
    UNION ALL
    SELECT a.position, NULL::integer, NULL::bigint, NULL::text, NULL::text, NULL::bytea,
           NULL::text, NULL::timestamptz, a.claim_token
    FROM acked a;
END
$$;
