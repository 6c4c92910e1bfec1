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
