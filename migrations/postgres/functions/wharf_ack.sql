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
