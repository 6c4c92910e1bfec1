-- Acks and claim extensions as calls whose plans are always keyed (ADR 0048).
--
-- `ack`, `ack_many` and `extend` were cached statements: each connection prepares them once,
-- and after a few runs Postgres may settle on a generic plan for good. Made while `delivery`
-- held a handful of rows (a consumer that started on an empty queue, statistics taken then),
-- that plan was a sequential scan, and it stayed one as the queue grew: at 300k deliveries an
-- ack read 4,840 buffers (24 ms), an ack of two 4,840 plus a hash of the whole table spilled to
-- disk (110 ms), an extension 4,840 (22 ms); keyed, each reads a few buffers.
--
-- Each statement now runs inside a function, as the claim does (migration 0013): one round
-- trip through a statement the connection prepares once, planned with sequential scans, bitmap
-- scans, hash joins and merge joins disabled, so the only plans left are primary-key look-ups,
-- one per key (for a batch, a nested loop over the keys). A batch's join is planned on every
-- call with the call's values (`plan_cache_mode = force_custom_plan`): which side of the loop
-- goes first depends on the sizes. The settings hold only while the function runs.
-- `tests/tests/queue_plans.rs` checks each call on a queue that grew to 300k rows after the
-- connection first used it.
--
-- The statements are the ones `queue/src/postgres/claim.rs` sent before, unchanged.

-- Deletes the deliveries whose (group, position, claim token) are listed, pairwise; returns the
-- keys it deleted (a key whose claim token moved on is not deleted and not returned).
CREATE OR REPLACE FUNCTION wharf_settle(
    p_groups TEXT[],
    p_positions BIGINT[],
    p_tokens BIGINT[]
) RETURNS TABLE (
    s_group TEXT,
    s_position BIGINT,
    s_token BIGINT
)
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    RETURN QUERY
    WITH settled AS (
        DELETE FROM delivery d
        USING unnest(p_groups, p_positions, p_tokens) AS k(group_name, position, claim_token)
        WHERE d.group_name = k.group_name AND d.position = k.position
          AND d.claim_token = k.claim_token
        RETURNING d.group_name, d.position, d.claim_token
    )
    SELECT * FROM settled;
END
$$;

-- Deletes one delivery if `p_token` still holds its claim; returns how many rows it deleted (0
-- or 1). The single-message form of `wharf_settle`. Its statement is an equality on every
-- column of the primary key, and for plain equalities Postgres builds its index path with all
-- of them as index conditions (only a list, `= ANY`, gets a path without it, which is how the
-- claim's generic plan went wrong, ADR 0042); with sequential and bitmap scans off the one plan
-- left is that look-up, whatever the statistics. So its plan is made once per connection
-- (`force_generic_plan`) instead of on every call: an ack is the per-message path of a consumer
-- that acks by hand.
CREATE OR REPLACE FUNCTION wharf_ack(
    p_group TEXT,
    p_position BIGINT,
    p_token BIGINT
) RETURNS INTEGER
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    deleted INTEGER;
BEGIN
    DELETE FROM delivery
    WHERE group_name = p_group AND position = p_position AND claim_token = p_token;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;

-- Pushes a held claim's visibility to `p_seconds` from now, only for the holder of its token;
-- returns the new `visible_at`, or NULL when the claim is no longer the caller's. A primary-key
-- equality like `wharf_ack`, planned once per connection for the same reason.
CREATE OR REPLACE FUNCTION wharf_extend(
    p_group TEXT,
    p_position BIGINT,
    p_token BIGINT,
    p_seconds DOUBLE PRECISION
) RETURNS TIMESTAMPTZ
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    extended TIMESTAMPTZ;
BEGIN
    UPDATE delivery SET visible_at = clock_timestamp() + make_interval(secs => p_seconds)
    WHERE group_name = p_group AND position = p_position AND claim_token = p_token
    RETURNING visible_at INTO extended;
    RETURN extended;
END
$$;
