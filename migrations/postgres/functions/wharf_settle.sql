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
