-- The speculative register's check (ADR 0052). A process that holds a group's state decides
-- on what it last knew of the group (no read first) and sends the decision as one statement;
-- that statement bumps the lock-row version as the optimistic write does (ADR 0037), and
-- this function raises, with the same SQLSTATE as `wharf_expect_version`, unless the
-- decision's other inputs still hold at the write: the stream head it folded up to, what it
-- observed (a group's live instances and the declarer's open wait), and a decision time not
-- ahead of the store's clock. `what` names the input that moved, for the log. Additive: older
-- builds never call it.
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
