-- The speculative register's check (ADR 0052): true when `holds`, else raises with SQLSTATE
-- WH409 (as `wharf_expect_version` does) naming `what`, the decision's input that moved.
CREATE OR REPLACE FUNCTION wharf_expect_assumed(holds boolean, what text)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
  IF holds IS NOT TRUE THEN
    RAISE EXCEPTION 'a speculative decision''s input moved: %', what
      USING ERRCODE = 'WH409';
  END IF;
  RETURN true;
END
$$;
