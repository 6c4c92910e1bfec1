-- The optimistic executor's version check (ADR 0037): true when `actual` is `expected`, else
-- raises with SQLSTATE WH409, so that the one statement it is part of (the aggregate's
-- lock-row version bumped, the event and its projections written) rolls back whole.
CREATE OR REPLACE FUNCTION wharf_expect_version(actual bigint, expected bigint)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
  IF actual IS DISTINCT FROM expected THEN
    RAISE EXCEPTION 'aggregate version moved: % where % was expected', actual, expected
      USING ERRCODE = 'WH409';
  END IF;
  RETURN true;
END
$$;
