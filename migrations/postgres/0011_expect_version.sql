-- The optimistic executor's version check (ADR 0037). Its write is one autocommit statement
-- whose first CTE bumps the aggregate's lock-row version; this function raises, with its own
-- SQLSTATE, unless that version is the one the unlocked read saw plus one, so the whole
-- statement, event insert and projections included, rolls back when another attempt
-- committed in between. (Not `found`: that is PL/pgSQL's own FOUND.) Additive: older builds
-- never call it.
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
